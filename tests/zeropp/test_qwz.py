"""qwZ (zero_quantized_weights) at W=4 in nodes of 2, alone and with hpZ: 50 steps of losses within the
quantization's bound of plain stage 3, and the gathers official keeps exact stay exact."""

import pytest

from tests.spawn import run_distributed
from tests.zeropp import qwz_workers

pytestmark = pytest.mark.slow  # spawns gloo ranks


def test_fifty_steps_of_losses_stay_within_the_quantization_bound_of_plain_stage_3():
    assert run_distributed(qwz_workers.numerics_worker, 4) == []


def test_gathered_parameters_and_the_state_dict_are_exact_and_the_forward_is_quantized():
    assert run_distributed(qwz_workers.exact_gathers_worker, 4) == []
