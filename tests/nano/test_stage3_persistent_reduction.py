"""Stage 3's persistent buffers reduce-scatter their gradients together: one call per micro-step when
they fit in `reduce_bucket_size` (as official DeepSpeed's `reduce_scatter_coalesced` reduces its
bucket in one call), their gradient partitions equal to the single-process reference's, on 2 and 3
gloo ranks (3: partitions padded unevenly)."""

import pytest

from tests.nano.persistent_reduction_workers import persistent_reduction_worker
from tests.spawn import run_distributed

pytestmark = pytest.mark.slow  # spawns gloo ranks: `make test-fast` leaves it out


@pytest.mark.parametrize("world_size", [2, 3])
def test_persistent_gradients_reduce_in_one_call_and_equal_the_reference(world_size):
    assert run_distributed(persistent_reduction_worker, world_size) == []
