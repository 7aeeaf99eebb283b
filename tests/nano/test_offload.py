"""CPU offload of the optimizer (stages 1-3) and of parameters (stage 3): the same math, other places."""

import pytest

from tests.nano import offload_workers
from tests.spawn import run_distributed

pytestmark = pytest.mark.slow  # spawns gloo ranks: `make test-fast` leaves it out


@pytest.mark.parametrize("world_size", [1, 2])
def test_offload_equals_no_offload_bit_for_bit(world_size):
    assert run_distributed(offload_workers.bitwise_worker, world_size) == []


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_offload_matches_the_reference(world_size):
    assert run_distributed(offload_workers.reference_worker, world_size) == []


@pytest.mark.parametrize("world_size", [1, 2])
def test_bytes_by_place_equal_the_documented_formula(world_size):
    assert run_distributed(offload_workers.memory_worker, world_size) == []
