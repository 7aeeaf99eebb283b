"""The throughput table (tokens/s, TFLOP/s, MFU) and what it lets a reader conclude, for the
console and the markdown report alike (figures: `analysis.runs.speed.throughput`)."""

from __future__ import annotations

from zero_lab.analysis.runs.speed.throughput import OVERHEAD_MFU_PCT, mfu_text, overhead_bound

DEFINITION = ("tokens/s counts every rank's tokens (padding included) over the median step after the first; "
              "TFLOP/s is per device: tokens/s per device x FLOPs per token (6 x the weights that multiply "
              "activations + 12 x layers x heads x head size x sequence length, torchtitan's count; "
              "docs/throughput.md); MFU is that over the device's peak dense TFLOP/s.")


def number(value: object, digits: int) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def throughput_table(rows: list[dict]) -> tuple[list[str], list[list[str]]]:
    """A line per run that logged steps: its cell, tokens/s in all and per device, TFLOP/s, MFU."""
    headers = ["world size", "stage", "impl", "tokens/s", "tokens/s per device", "TFLOP/s per device", "MFU"]
    body = [[str(row["world_size"]), str(row["stage"]), row["impl"], number(row.get("tokens_per_s"), 0),
             number(row.get("tokens_per_s_per_device"), 0), number(row.get("tflops"), 3), mfu_text(row)]
            for row in rows if row.get("steps")]
    return headers, body


def throughput_notes(rows: list[dict]) -> list[str]:
    """What the MFU column lets a reader conclude: where it is n/a, and whether the step times
    only rank host overhead (an MFU below OVERHEAD_MFU_PCT)."""
    measured = [row for row in rows if row.get("steps")]
    notes = []
    unknown = sorted({str(row.get("device_name") or "this device").replace("_", " ")  # the log's name, spaced
                      for row in measured if row.get("mfu_pct") is None and row.get("tflops") is not None})
    if unknown:
        notes.append(f"MFU is n/a: no peak TFLOP/s is known for {', '.join(unknown)}; give --peak-tflops to "
                     "measure against one.")
    if any(overhead_bound(row) for row in measured):
        notes.append(f"MFU below {OVERHEAD_MFU_PCT:g}%: most of each step is host overhead (the engine's "
                     "Python, kernel launches, waits), not the model's math, so the step-time ratios here rank "
                     "that overhead, not ZeRO's traffic; measure at a larger micro-batch or sequence to compare "
                     "the engines at scale.")
    return notes
