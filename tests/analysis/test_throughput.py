"""tokens/s per device, TFLOP/s and MFU from a run's summary and `[model]` line (analysis.runs.speed.throughput)."""

from __future__ import annotations

import pytest

from zero_lab.analysis.runs.speed.throughput import OVERHEAD_MFU_PCT, mfu_text, overhead_bound, table_peak, throughput


@pytest.mark.parametrize("device, dtype, peak", [
    ("NVIDIA_H100_80GB_HBM3", "torch.bfloat16", 989.0),
    ("NVIDIA_H100_PCIe", "torch.bfloat16", 756.0),
    ("NVIDIA_H100_NVL", "torch.float16", 835.0),
    ("NVIDIA_H200", "torch.bfloat16", 989.0),
    ("NVIDIA_A100-SXM4-80GB", "torch.float32", 19.5),
    ("NVIDIA_H100_80GB_HBM3", "torch.float32", 67.0),
    ("Intel(R)_Xeon(R)_Processor_@_2.80GHz", "torch.float32", None),
])
def test_the_table_names_a_peak_for_known_gpus_only(device, dtype, peak):
    assert table_peak(device, dtype) == peak


def test_mfu_is_achieved_over_peak_per_device():
    """Two ranks at 20,000 tokens/s in all: 10,000 per device; x 4.2e9 FLOPs = 42 TFLOP/s; of 989: 4.25%."""
    model = {"flops_per_token": 4.2e9, "device_name": "NVIDIA_H100_80GB_HBM3", "compute_dtype": "torch.bfloat16"}
    row = throughput(20_000.0, 2, model)
    assert row["tokens_per_s_per_device"] == 10_000.0
    assert row["tflops"] == pytest.approx(42.0)
    assert row["mfu_pct"] == pytest.approx(100 * 42.0 / 989.0)
    assert (row["peak_tflops"], row["peak_tflops_source"]) == (989.0, "table")
    assert mfu_text(row) == "4.2%" and overhead_bound(row) and OVERHEAD_MFU_PCT == 10.0


def test_a_given_peak_wins_and_a_cpu_without_one_reads_n_a():
    model = {"flops_per_token": 1e6, "device_name": "Intel_Xeon", "compute_dtype": "torch.float32"}
    unknown = throughput(5_000.0, 1, model)
    assert unknown["tflops"] == pytest.approx(0.005) and unknown["mfu_pct"] is None
    assert mfu_text(unknown) == "n/a" and not overhead_bound(unknown)
    given = throughput(5_000.0, 1, model, peak_tflops=0.5)
    assert given["mfu_pct"] == pytest.approx(1.0) and given["peak_tflops_source"] == "--peak-tflops"


def test_a_run_without_steps_or_a_count_has_no_figures():
    model = {"flops_per_token": float("nan"), "device_name": "NVIDIA_H200", "compute_dtype": "torch.bfloat16"}
    row = throughput(None, 2, model)
    assert row["tokens_per_s_per_device"] is None and row["tflops"] is None and row["mfu_pct"] is None
    assert throughput(100.0, 1, model)["tflops"] is None


def test_the_notes_name_a_device_without_a_peak_as_it_calls_itself_and_flag_overhead():
    from zero_lab.analysis.report.throughput_table import throughput_notes

    cpu = {"steps": 3, "tflops": 0.01, "mfu_pct": None, "device_name": "Intel(R)_Xeon(R)_Processor_@_2.80GHz"}
    gpu = {"steps": 3, "tflops": 20.0, "mfu_pct": 2.0, "device_name": "NVIDIA_H200"}
    unknown, overhead = throughput_notes([cpu, gpu])
    assert unknown.startswith("MFU is n/a: no peak TFLOP/s is known for Intel(R) Xeon(R) Processor @ 2.80GHz;")
    assert overhead.startswith(f"MFU below {OVERHEAD_MFU_PCT:g}%")
    assert throughput_notes([{**gpu, "mfu_pct": 40.0}]) == []
