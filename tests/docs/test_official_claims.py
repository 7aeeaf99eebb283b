"""What the docs say official DeepSpeed does, checked by running it (DS_ACCELERATOR=cpu, one rank)."""

import pytest

from tests.docs.official_claim_workers import (fp32_non_finite_worker, immediate_grad_update_worker,
                                               load_without_latest_worker, optimizer_classes_worker,
                                               overlap_comm_default_worker,
                                               stage3_keys_worker)
from tests.spawn import run_distributed


@pytest.mark.official
def test_official_stage_0_bf16_runs_the_unfused_optimizer():
    assert run_distributed(optimizer_classes_worker, 1) == []


@pytest.mark.official
def test_official_ignores_immediate_grad_update_at_stage_0_bf16():
    assert run_distributed(immediate_grad_update_worker, 1) == []


@pytest.mark.official
def test_official_skips_a_non_finite_fp32_step_at_stages_1_to_3_only():
    assert run_distributed(fp32_non_finite_worker, 1) == []


@pytest.mark.official
def test_official_ignores_stage3_keys_below_stage_3():
    assert run_distributed(stage3_keys_worker, 1) == []


@pytest.mark.official
def test_official_load_checkpoint_without_latest_returns_none(tmp_path):
    assert run_distributed(load_without_latest_worker, 1, str(tmp_path)) == []


@pytest.mark.official
def test_official_defaults_overlap_comm_to_true_at_stage_3_only():
    assert run_distributed(overlap_comm_default_worker, 1) == []
