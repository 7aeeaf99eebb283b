"""nano stage 3 against the single-process AdamW reference, on 1, 2 and 3 gloo ranks (TrapNet: tied
weights, a block called twice, an unused block, activation checkpointing)."""

import pytest

from tests.nano import stage3_workers
from tests.nano.gather_bytes_workers import explained_gathers_worker
from tests.spawn import run_distributed

pytestmark = pytest.mark.slow  # spawns gloo ranks: `make test-fast` leaves it out


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_every_step_matches_the_reference(world_size):
    assert len(stage3_workers.parity_cases()) == 16
    assert run_distributed(stage3_workers.parity_worker, world_size) == []


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_forward_without_backward_leaves_nothing_gathered(world_size):
    assert run_distributed(stage3_workers.eval_forward_worker, world_size) == []


def test_an_unused_block_is_named_when_unused_parameters_are_refused():
    assert run_distributed(stage3_workers.unused_parameters_worker, 2) == []


@pytest.mark.parametrize("world_size", [1, 2])
def test_gathered_parameters_modifier_rank_reaches_every_rank_and_the_master(world_size):
    assert run_distributed(stage3_workers.modifier_rank_worker, world_size) == []


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_hugging_face_gradient_checkpointing_recomputes_inside_a_gathered_unit(world_size):
    assert run_distributed(stage3_workers.hf_checkpointing_worker, world_size) == []


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_live_bytes_equal_the_documented_formula(world_size):
    assert run_distributed(stage3_workers.memory_worker, world_size) == []


def test_prefetch_live_budget_and_reuse_distance_decide_what_is_gathered():
    assert run_distributed(stage3_workers.knobs_worker, 2) == []


@pytest.mark.parametrize("world_size", [1, 2])
def test_a_model_built_under_init_trains_as_the_reference(world_size):
    assert run_distributed(stage3_workers.init_parity_worker, world_size) == []


def test_building_under_init_holds_a_slice_of_the_model_and_one_module():
    assert run_distributed(stage3_workers.init_memory_worker, 2) == []


def test_explain_predicts_the_module_calls_and_gather_bytes_the_engine_records():
    assert run_distributed(explained_gathers_worker, 2) == []
