"""Stage 3 gathers what official DeepSpeed gathers under the same config (DS_ACCELERATOR=cpu, 2 ranks)."""

import pytest

from tests.nano.gather_bytes_workers import gather_bytes_worker
from tests.spawn import run_distributed


@pytest.mark.official
def test_stage3_all_gather_bytes_and_fetch_calls_per_step_equal_officials():
    assert run_distributed(gather_bytes_worker, 2) == []
