"""Checkpoints crossing between nano and official DeepSpeed on gloo ranks: official resumes
nano's files (see tests/nano/checkpoint_interop_workers.py; the other direction is
test_checkpoints.py's official cross-load)."""

import pytest

from tests.nano.checkpoint_interop_workers import nano_to_official_worker
from tests.spawn import run_distributed

pytestmark = [pytest.mark.slow, pytest.mark.official]


def test_official_resumes_nano_checkpoints_and_trains_as_nano_does(tmp_path):
    cases = [(1, "fp32"), (2, "fp32"), (3, "fp32"), (3, "bf16")]
    assert run_distributed(nano_to_official_worker, 2, str(tmp_path), cases) == []
