"""Stage 1 with bf16 and `data_types.grad_accum_dtype: fp32` (official's BF16_Optimizer case):
against its single-process reference at 1, 2 and 3 ranks, and side by side with official DeepSpeed.
Its bytes are checked with every stage's in tests/nano/test_parity.py (the live-bytes test)."""

import pytest

from tests.nano import fp32_accumulation_workers as workers
from tests.spawn import run_distributed


@pytest.mark.slow
@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_fp32_accumulation_matches_its_reference(world_size):
    assert run_distributed(workers.reference_worker, world_size) == []


@pytest.mark.official
def test_fp32_accumulation_matches_official_bf16_optimizer():
    assert run_distributed(workers.official_worker, 2) == []


@pytest.mark.official
def test_nano_and_official_resume_the_fp32_accumulation_checkpoint_nano_wrote(tmp_path):
    assert run_distributed(workers.checkpoint_worker, 2, str(tmp_path)) == []


@pytest.mark.official
def test_nano_and_official_resume_the_checkpoint_officials_bf16_optimizer_wrote(tmp_path):
    """Official's BF16_Optimizer files hold no zero_stage: nano reads them as stage 1's flat cut."""
    assert run_distributed(workers.checkpoint_worker, 2, str(tmp_path), "official") == []
