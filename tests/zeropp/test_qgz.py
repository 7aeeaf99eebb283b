"""qgZ (zero_quantized_gradients) at W=4 in nodes of 2, alone and with qwZ and hpZ: 50 steps of reduced
gradients within the int4 bound of the exact average, and losses within reach of plain stage 3's."""

import pytest

from tests.spawn import run_distributed
from tests.zeropp import qgz_workers

pytestmark = pytest.mark.slow  # spawns gloo ranks


def test_fifty_steps_of_gradients_within_the_int4_bound_and_losses_near_plain_stage_3():
    assert run_distributed(qgz_workers.numerics_worker, 4) == []
