"""Estimate formulas against the ZeRO paper's figures and official DeepSpeed's own estimators."""

import os

import pytest

from zero_lab.analysis.memory.estimate import estimate_rows, nano_bytes, official_bytes, paper_bytes, parse_param_count

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

    host, device = estimate_zero2_model_states_mem_needs(P, num_gpus_per_node=world_size, cpu_offload=False)
    assert official_bytes(2, P, world_size, None) == {"device": device, "host": host}
    assert device == 2 * P + int(18 * P / world_size), "2P + 18P/N in code"
    host, device, _ = estimate_zero3_model_states_mem_needs(P, 10**8, num_gpus_per_node=world_size, cpu_offload=False)
    assert official_bytes(3, P, world_size, 10**8) == {"device": device, "host": host}
    assert official_bytes(1, P, world_size, None) is None, "official DeepSpeed has no stage-1 estimator"
    assert official_bytes(0, P, world_size, None) is None


@pytest.mark.parametrize("world_size", [1, 4])
def test_official_offload_columns_are_deepspeeds_cpu_offload_estimators(world_size):
    from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs
    from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs

    host, device = estimate_zero2_model_states_mem_needs(P, num_gpus_per_node=world_size, cpu_offload=True)
    assert official_bytes(2, P, world_size, None, "optimizer") == {"device": device, "host": host}
    assert device == 2 * P, "ZeRO-Offload keeps the 16-bit parameters on the device"
    host, device, _ = estimate_zero3_model_states_mem_needs(P, 10**8, num_gpus_per_node=world_size,
                                                            cpu_offload=True, cpu_offload_params=False)
    assert official_bytes(3, P, world_size, 10**8, "optimizer") == {"device": device, "host": host}
    host, device, _ = estimate_zero3_model_states_mem_needs(P, 10**8, num_gpus_per_node=world_size,
                                                            cpu_offload=True, cpu_offload_params=True)
    assert official_bytes(3, P, world_size, 10**8, "param") == {"device": 4 * 10**8, "host": host}
    assert official_bytes(2, P, world_size, None, "param") is None, "parameters offload only at stage 3"


def test_official_stage2_code_counts_4_bytes_more_per_parameter_than_the_paper():
    for world_size in (1, 2, 8):
        gap = official_bytes(2, P, world_size, None)["device"] - paper_bytes(2, "bf16", P, world_size)
        assert gap == pytest.approx(4 * P / world_size, rel=1e-6)


def device(figures):
    assert figures["host"] == 0, "nothing on the host without offload"
    return figures["device"]


def test_nano_column_is_nanos_formula_and_needs_the_units_at_stage_3():
    assert device(nano_bytes(2, "fp32", 1000, 2)) == 4 * 1000 + 12 * 1000 // 2
    # stage 1 peaks at the end of backward: full fp32 gradients beside parameters and states
    assert device(nano_bytes(1, "fp32", 1000, 2)) == 4 * 1000 + 4 * 1000 + 8 * 1000 // 2
    assert device(nano_bytes(2, "bf16", 1000, 2)) == 2 * 1000 + 16 * 1000 // 2
    assert nano_bytes(3, "fp32", 1000, 2) is None, "a bare count does not say what stage 3 gathers"


def test_nano_stage3_gathers_the_root_and_the_largest_block_inside_backward():
    """fp32, W=2, buffers already padded to 2N: the peak is inside a backward, every buffer's
    partition (4 B) and gradient partition (4 B) and states (8 B) per element / 2, the persistent
    buffer whole (4 B/element), plus the root and the largest block gathered whole."""
    buffers = [(100, "persistent"), (400, "block"), (600, "block"), (200, "root")]
    sharded = 400 + 600 + 200
    expected = 100 * 4 + 100 * (4 + 8) // 2 + sharded * (4 + 4 + 8) // 2 + (600 + 200) * 4
    assert device(nano_bytes(3, "fp32", 1300, 2, buffers)) == expected


def test_nano_offload_moves_master_states_and_gradient_partition_to_the_host():
    """bf16 stage 2 with the optimizer offloaded keeps 2P on the device (issue 10); stage 3 with
    both offloads keeps only the gathered units there."""
    assert nano_bytes(2, "bf16", 1000, 2, offload="optimizer") == {"device": 2 * 1000, "host": 16 * 1000 // 2}
    buffers = [(400, "block"), (600, "block"), (200, "root")]
    assert nano_bytes(3, "bf16", 1200, 2, buffers, offload="param") == {
        "device": (600 + 200) * 2, "host": 1200 * (2 + 16) // 2}
    assert nano_bytes(0, "bf16", 1000, 2, offload="optimizer") is None, "stage 0 has no partition to offload"


def test_rows_and_param_counts():
    rows = estimate_rows(10**6, [1, 2], [1, 2], "fp32", with_official=False)
    assert [(r["world_size"], r["stage"]) for r in rows] == [(1, 1), (1, 2), (2, 1), (2, 2)]
    assert rows[0]["paper_mb"] == pytest.approx(16 * 10**6 / 2**20)
    assert parse_param_count("600M") == 600_000_000 and parse_param_count("1.5B") == 1_500_000_000
    assert parse_param_count("7e9") == 7 * 10**9 and parse_param_count("tiny") is None
