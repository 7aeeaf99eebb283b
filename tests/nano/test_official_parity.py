"""nano against official DeepSpeed (DS_ACCELERATOR=cpu) on the same model, data and seed, fp32, 2 ranks."""

import pytest

from tests.nano.official_workers import (non_finite_steps_worker, official_parity_worker, official_stage3_worker,
                                         stage0_bf16_worker)
from tests.spawn import run_distributed


@pytest.mark.official
def test_nano_matches_official_deepspeed_step_for_step():
    assert run_distributed(official_parity_worker, 2) == []


@pytest.mark.official
def test_nano_stage3_matches_official_deepspeed_stage3():
    assert run_distributed(official_stage3_worker, 2) == []


@pytest.mark.official
def test_non_finite_bf16_steps_are_applied_or_skipped_per_stage_as_official_does():
    assert run_distributed(non_finite_steps_worker, 1) == []


@pytest.mark.official
def test_stage_0_bf16_ignores_immediate_grad_update_as_official_does():
    assert run_distributed(stage0_bf16_worker, 2) == []
