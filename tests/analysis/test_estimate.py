"""Estimate formulas against the ZeRO paper's figures and official DeepSpeed's own estimators."""

import os

import pytest

from zero_lab.analysis.estimate import estimate_rows, nano_bytes, official_bytes, paper_bytes, parse_param_count

os.environ.setdefault("DS_ACCELERATOR", "cpu")

P = 7_500_000_000  # the ZeRO paper's example: 7.5B parameters, 64 GPUs


def test_paper_formula_reproduces_the_papers_figure_1():
    gb = 10**9
    assert paper_bytes(0, "bf16", P, 64) == 120 * gb
    assert paper_bytes(1, "bf16", P, 64) == pytest.approx(31.4 * gb, rel=1e-2)
    assert paper_bytes(2, "bf16", P, 64) == pytest.approx(16.6 * gb, rel=1e-2)
    assert paper_bytes(3, "bf16", P, 64) == pytest.approx(1.9 * gb, rel=2e-2)  # the paper rounds 1.875


def test_paper_fp32_has_no_separate_master_copy():
    assert paper_bytes(0, "fp32", 1000, 1) == 16 * 1000
    assert paper_bytes(2, "fp32", 1000, 2) == 4 * 1000 + 12 * 1000 // 2


@pytest.mark.parametrize("world_size", [1, 2, 8, 64])
def test_official_column_is_deepspeeds_own_estimators(world_size):
    from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs
    from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs

    assert official_bytes(2, P, world_size, None) == estimate_zero2_model_states_mem_needs(
        P, num_gpus_per_node=world_size, cpu_offload=False)[1]
    assert official_bytes(2, P, world_size, None) == 2 * P + int(18 * P / world_size), "2P + 18P/N in code"
    assert official_bytes(3, P, world_size, 10**8) == estimate_zero3_model_states_mem_needs(
        P, 10**8, num_gpus_per_node=world_size, cpu_offload=False)[1]
    assert official_bytes(1, P, world_size, None) is None, "official DeepSpeed has no stage-1 estimator"
    assert official_bytes(0, P, world_size, None) is None


def test_official_stage2_code_counts_4_bytes_more_per_parameter_than_the_paper():
    for world_size in (1, 2, 8):
        gap = official_bytes(2, P, world_size, None) - paper_bytes(2, "bf16", P, world_size)
        assert gap == pytest.approx(4 * P / world_size, rel=1e-6)


def test_nano_column_is_nanos_formula_and_absent_for_stage_3():
    assert nano_bytes(2, "fp32", 1000, 2) == 4 * 1000 + 12 * 1000 // 2
    # stage 1 peaks at the end of backward: full fp32 gradients beside parameters and states
    assert nano_bytes(1, "fp32", 1000, 2) == 4 * 1000 + 4 * 1000 + 8 * 1000 // 2
    assert nano_bytes(2, "bf16", 1000, 2) == 2 * 1000 + 16 * 1000 // 2
    assert nano_bytes(3, "fp32", 1000, 2) is None


def test_rows_and_param_counts():
    rows = estimate_rows(10**6, [1, 2], [1, 2], "fp32", with_official=False)
    assert [(r["world_size"], r["stage"]) for r in rows] == [(1, 1), (1, 2), (2, 1), (2, 2)]
    assert rows[0]["paper_mb"] == pytest.approx(16 * 10**6 / 2**20)
    assert parse_param_count("600M") == 600_000_000 and parse_param_count("1.5B") == 1_500_000_000
    assert parse_param_count("7e9") == 7 * 10**9 and parse_param_count("tiny") is None
