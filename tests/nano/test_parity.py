"""nano against the single-process torch.optim.AdamW reference, on 1, 2 and 3 gloo ranks.

World size 3 forces uneven partitions (200 parameters in two groups) and buckets smaller than a
parameter cut through parameters and partitions alike.
"""

import pytest

from tests.nano import workers
from tests.spawn import run_distributed

pytestmark = pytest.mark.slow  # spawns gloo ranks: `make test-fast` leaves it out


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_every_step_matches_the_reference(world_size):
    assert len(workers.parity_cases()) == 80
    assert run_distributed(workers.parity_worker, world_size) == []


@pytest.mark.parametrize("world_size", [2, 3])
def test_stages_agree_with_each_other(world_size):
    assert run_distributed(workers.stages_agree_worker, world_size) == []


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_live_bytes_equal_the_documented_formula(world_size):
    assert run_distributed(workers.memory_worker, world_size) == []


@pytest.mark.parametrize("world_size", [2, 3])
def test_fp16_overflow_on_one_rank_skips_on_every_rank(world_size):
    assert run_distributed(workers.fp16_overflow_worker, world_size) == []


def test_unused_parameters_are_handled_as_deepspeed_does():
    assert run_distributed(workers.unused_parameters_worker, 2) == []


def test_a_nan_gradient_on_one_rank_skips_the_step_on_every_rank():
    assert run_distributed(workers.nonfinite_worker, 2) == []
