"""hpZ (zero_hpz_partition_size) at W=4 in nodes of 2: exact, node-local backward gathers, its bytes."""

import pytest

from tests.spawn import run_distributed
from tests.zeropp import hpz_workers

pytestmark = pytest.mark.slow  # spawns gloo ranks


def test_hpz_matches_the_reference_and_backward_gathers_stay_in_the_node():
    assert run_distributed(hpz_workers.parity_worker, 4) == []


def test_the_secondary_partition_costs_what_the_formula_says():
    assert run_distributed(hpz_workers.memory_worker, 4) == []


def test_a_checkpoint_loaded_under_hpz_reaches_every_gather(tmp_path):
    assert run_distributed(hpz_workers.resume_worker, 4, str(tmp_path)) == []
