"""Stage 3's backward adds no copy and no zero-fill of its own where the gradient is already the
bucket, or the share is the whole partition: nano's operations counted against the plain model's
backward, on 1 and 2 gloo ranks (`host_operations_workers`); the step's norm takes one dot per gradient
partition and sums them once. A gradient that shares its storage with another (two units read through
one `torch.cat`) is copied into its bucket, not adopted."""

import pytest

from tests.nano.host_operations_workers import host_operations_worker, shared_gradient_worker
from tests.spawn import run_distributed

pytestmark = pytest.mark.slow  # spawns gloo ranks: `make test-fast` leaves it out


@pytest.mark.parametrize("world_size", [1, 2])
def test_stage3_backward_copies_and_zeroes_only_what_it_must(world_size):
    assert run_distributed(host_operations_worker, world_size) == []


@pytest.mark.parametrize("world_size", [1, 2])
def test_a_gradient_that_shares_its_storage_is_copied_not_adopted(world_size):
    assert run_distributed(shared_gradient_worker, world_size) == []
