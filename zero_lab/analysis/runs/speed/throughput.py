"""How fast a run trained, as torchtitan reports it: tokens per second per device, the model
TFLOP/s those tokens achieved, and model FLOPs utilisation (MFU), the share of the device's peak
they reach.

Phase 1: the run's steady throughput (summary's `tokens_per_s`, every rank's tokens, padding
         included, over the median step after the first) split over its devices.
Phase 2: achieved TFLOP/s = tokens/s per device x the `[model]` line's `flops_per_token`
         (`workload.meters.model_flops`: 6 x matmul weights + the attention term).
Phase 3: MFU = achieved / peak, with the peak from `--peak-tflops`, else the table below by the
         `[model]` line's `device_name` and the compute dtype; "n/a" (None) where neither knows it,
         as on a CPU.

A run below OVERHEAD_MFU_PCT spends most of its step outside the model's math (the Python of the
engine, kernel launches, waits): its step-time ratios rank that overhead, not ZeRO's traffic.
"""

from __future__ import annotations

import math

# Dense (no sparsity) peak TFLOP/s per GPU from NVIDIA's datasheets: bf16 and fp16 on the tensor
# cores; fp32 on the CUDA cores (torch leaves TF32 off for matmuls by default). Matched against
# torch.cuda.get_device_name() by the first key it contains, so the more specific name comes first.
PEAK_TFLOPS = {
    "H100_NVL": {"bfloat16": 835.0, "float16": 835.0, "float32": 60.0},
    "H100_PCIe": {"bfloat16": 756.0, "float16": 756.0, "float32": 51.0},
    "H100": {"bfloat16": 989.0, "float16": 989.0, "float32": 67.0},  # SXM: "NVIDIA H100 80GB HBM3"
    "H200": {"bfloat16": 989.0, "float16": 989.0, "float32": 67.0},  # also GH200
    "A100": {"bfloat16": 312.0, "float16": 312.0, "float32": 19.5},
    "L40S": {"bfloat16": 362.0, "float16": 362.0, "float32": 91.6},
}
OVERHEAD_MFU_PCT = 10.0
DTYPE_NAMES = {"torch.bfloat16": "bfloat16", "torch.float16": "float16", "torch.float32": "float32"}


def table_peak(device_name: object, compute_dtype: object) -> float | None:
    """The table's peak for this device and compute dtype; None for a device or dtype it lacks."""
    name, dtype = str(device_name or ""), DTYPE_NAMES.get(str(compute_dtype), str(compute_dtype))
    for key, peaks in PEAK_TFLOPS.items():
        if key in name:
            return peaks.get(dtype)
    return None


def finite(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def throughput(tokens_per_s: object, world_size: int, model: dict, peak_tflops: float | None = None) -> dict:
    """summary.json's throughput keys for a run: tokens_per_s (all ranks) -> per device, TFLOP/s,
    MFU (percent) and the peak it was measured against with where the peak came from, beside the
    device's name."""
    total = finite(tokens_per_s)
    per_device = total / world_size if total is not None and world_size else None  # Phase 1
    flops = finite(model.get("flops_per_token"))
    achieved = per_device * flops / 1e12 if per_device is not None and flops is not None else None  # Phase 2
    peak, source = (peak_tflops, "--peak-tflops") if peak_tflops else (  # Phase 3
        table_peak(model.get("device_name"), model.get("compute_dtype")), "table")
    return {"device_name": model.get("device_name"), "tokens_per_s_per_device": per_device, "flops_per_token": flops, "tflops": achieved,
            "peak_tflops": peak, "peak_tflops_source": source if peak else None,
            "mfu_pct": 100 * achieved / peak if achieved is not None and peak else None}


def mfu_text(row: dict) -> str:
    """A run's MFU for a table: "41.2%", or "n/a" where no peak is known (a CPU without --peak-tflops)."""
    mfu = row.get("mfu_pct")
    return "n/a" if mfu is None else f"{mfu:.1f}%"


def overhead_bound(row: dict) -> bool:
    """True for a run whose MFU is known and below OVERHEAD_MFU_PCT: its step time is mostly host overhead."""
    mfu = row.get("mfu_pct")
    return mfu is not None and mfu < OVERHEAD_MFU_PCT
