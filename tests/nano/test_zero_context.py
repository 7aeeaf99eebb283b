"""zero.Init and zero.GatheredParameters as DeepSpeed's own unit tests use them, at 2 and 3 ranks,
for nano and (to show the cases are faithful) for official DeepSpeed on CPU."""

import pytest

from tests.nano.zero_context_workers import zero_context_worker
from tests.spawn import run_distributed


@pytest.mark.slow  # spawns gloo ranks
@pytest.mark.parametrize("world_size", [2, 3])
def test_zero_context_cases_hold_for_nano(world_size):
    assert run_distributed(zero_context_worker, world_size, "nano") == []


@pytest.mark.official
@pytest.mark.parametrize("world_size", [2, 3])
def test_zero_context_cases_hold_for_official_deepspeed(world_size):
    assert run_distributed(zero_context_worker, world_size, "official") == []
