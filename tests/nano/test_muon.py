"""nano's Muon (zero_lab/nano/muon/) at stages 1-3: against the single-process reference built on
official DeepSpeed's own Newton-Schulz, at 1, 2 and 3 gloo ranks (3: partitions cut matrices)."""

import pytest

from tests.nano import muon_workers
from tests.spawn import run_distributed

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_every_step_matches_the_muon_reference(world_size):
    assert run_distributed(muon_workers.reference_worker, world_size) == []


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_muon_bytes_equal_the_layouts_prediction(world_size):
    assert run_distributed(muon_workers.bytes_worker, world_size) == []


@pytest.mark.official
def test_losses_equal_official_deepspeeds():
    assert run_distributed(muon_workers.official_worker, 2) == []
