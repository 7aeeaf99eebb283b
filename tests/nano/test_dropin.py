"""DeepSpeed's engine calls and config keys that change a step, against the AdamW reference at 1-3 ranks."""

import pytest

from tests.nano import dropin_workers
from tests.spawn import run_distributed

pytestmark = pytest.mark.slow  # spawns gloo ranks: `make test-fast` leaves it out


@pytest.mark.parametrize("world_size", [1, 3])
def test_manual_accumulation_boundary_equals_managed_accumulation(world_size):
    assert run_distributed(dropin_workers.manual_boundary_worker, world_size) == []


@pytest.mark.parametrize("world_size", [2, 3])
def test_no_sync_accumulates_unreduced_gradients_until_the_next_reduction(world_size):
    assert run_distributed(dropin_workers.no_sync_worker, world_size) == []


@pytest.mark.parametrize("world_size", [2, 3])
def test_gradient_allreduce_op_sum_adds_gradients_over_ranks(world_size):
    assert run_distributed(dropin_workers.gradient_sum_worker, world_size) == []


def test_bf16_check_grad_overflow_false_applies_a_non_finite_step_at_stages_1_and_2():
    assert run_distributed(dropin_workers.bf16_overflow_check_worker, 2) == []


@pytest.mark.parametrize("world_size", [2, 3])
def test_16_bit_partitions_start_4_byte_aligned(world_size):
    assert run_distributed(dropin_workers.aligned_partitions_worker, world_size) == []
