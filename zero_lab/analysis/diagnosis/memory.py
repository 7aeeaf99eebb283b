"""The memory findings: a run that ran out, a peak the prediction missed, buffers that dominate the peak.

Each compares what the run measured (summary.json, the `[phase]` lines) with `explain`'s arithmetic
for the same cell (`peak_memory.predict_run_peak`: nano's formula, the activations, official's own
buffers), and recomputes the prediction with one setting changed for the predicted effect of a fix.

`out-of-memory` (error): the run failed for memory (the harness's `out of memory:` line, or the
    launcher's verdict on a killed rank): its figures, the cell's predicted peak, and the peak
    predicted with each usual remedy.
`estimate-gap` (warning): the measured peak is more than 15% and 64 MB from the predicted one (a
    smaller gap decides nothing on any device): the gap, where in the step the peak fell, and with
    nano's categories (`memory_breakdown`) the ones the prediction missed.
`buckets-dominate` (info): communication buffers sized by the config, not the model, are a third of
    the measured peak or more (official allocates `reduce_bucket_size` elements at start-up, however
    small the model): their bytes against the model states, and the peak with smaller buckets.
"""

from __future__ import annotations

from zero_lab.analysis.diagnosis.finding import Finding, mb
from zero_lab.analysis.diagnosis.run_data import RunData
from zero_lab.analysis.runs.logparse import is_number
from zero_lab.analysis.memory.peak_memory import (PeakPrediction, communication_buffer_bytes, model_state_categories_at,
                                           predict_run_peak)
from zero_lab.analysis.diagnosis.stage3 import fetch_rules
from zero_lab.nano.dtypes import BYTES_OF_PRECISION

GAP_PCT = 15.0  # the estimate's promise (tests/analysis/test_peak_memory.py holds runs within it)
GAP_FLOOR = 64 * 2**20  # a gap smaller than this decides nothing on any device: not worth a warning
BUCKET_SHARE = 1 / 3
NOTED_SHARE = 0.05  # a category's gap worth a line of evidence: this share of the measured peak
ACTIVATIONS = "activations and temporaries"


def prediction(run: RunData, model: dict | None = None, zero: dict | None = None,
               stage: int | None = None) -> PeakPrediction | None:
    """The cell's predicted peak, or with the `[model]`/`[zero]` figures or stage replaced."""
    if run.world_size is None:
        return None
    return predict_run_peak(model or run.log.model, zero or run.log.zero, stage if stage is not None else run.stage,
                            run.precision, run.world_size)


def remedies(run: RunData) -> list[tuple[str, PeakPrediction | None]]:
    """The usual ways down, each with its predicted peak: a higher stage, half the micro-batch,
    gradient checkpointing."""
    model = run.log.model
    found = []
    if run.stage is not None and run.stage < 3:
        found.append((f"--stage {run.stage + 1}", prediction(run, zero={**run.log.zero, "stage": run.stage + 1},
                                                             stage=run.stage + 1)))
    if is_number(model.get("micro_batch")) and model["micro_batch"] > 1:
        found.append((f"--batch-size {model['micro_batch'] // 2}",
                      prediction(run, model={**model, "micro_batch": model["micro_batch"] // 2})))
    if model.get("gradient_checkpointing") is False:
        found.append(("--gradient-checkpointing", prediction(run, model={**model, "gradient_checkpointing": True})))
    return [(change, predicted) for change, predicted in found if predicted is not None]


def out_of_memory(run: RunData) -> list[Finding]:
    if run.summary.get("failure") != "out_of_memory":
        return []
    predicted = prediction(run)
    world_size = run.world_size or 1
    evidence = [str(run.summary.get("error"))]
    if predicted is not None:
        evidence.append(f"predicted peak of live tensors: {mb(predicted.peak)} per rank at the {predicted.moment} "
                        f"({world_size} ranks: {mb(predicted.peak * world_size)})")
    if is_number(run.summary.get("rss_max_mb")):
        evidence.append(f"largest resident set of a rank while it ran: {run.summary['rss_max_mb']:.0f} MB (on CPU it "
                        "includes some 400-800 MB of libraries besides the tensors)")
    options = remedies(run)
    fix = "; ".join(f"{change}: predicted peak {mb(peak.peak)} per rank" for change, peak in options)
    return [Finding(
        "out-of-memory", f"{run.label}: ran out of memory", evidence,
        "a rank needed more memory than the device (or --device-memory) had left",
        (f"lower the peak or give it room: {fix}" if fix else "lower the peak (a higher stage, offload, a smaller "
         "micro-batch) or give the run more memory") + "; `zero-lab estimate` and `zero-lab explain` show the figures "
        "before a launch",
        runs=[run.name], figures={"predicted_peak_bytes": predicted.peak if predicted else None,
                                  "rss_max_mb": run.summary.get("rss_max_mb"),
                                  "remedies": {change: peak.peak for change, peak in options}})]


def measured_categories(run: RunData, phase: str) -> dict[str, int]:
    """nano's categories and live bytes in the last `[phase]` sample of `phase` ({} without categories)."""
    rows = [row for row in run.summary.get("phases") or run.log.phases if row.get("phase") == phase]
    return {key: value for key, value in rows[-1].items() if key.endswith("_bytes") and is_number(value)} if rows else {}


def category_gaps(run: RunData, predicted: PeakPrediction) -> list[tuple[str, str, int, int]]:
    """(moment, category, measured, predicted): nano's categories after the forward and after the
    backward against the formula's at the same moments, and the rest of the live bytes against the
    predicted activations (saved ones after the forward, none after the backward). [] without categories."""
    shape = run.shape()
    if shape is None or run.stage is None or run.world_size is None:
        return []
    rows = []
    for formula_moment, phase in (("forward", "after_forward"), ("backward", "after_backward")):
        measured = measured_categories(run, phase)
        if not any(key not in ("live_bytes", "peak_bytes") for key in measured):
            return []
        states = model_state_categories_at(formula_moment, run.stage, run.precision, run.world_size, shape,
                                           fetch_rules(run))
        found = [(phase, category, measured.get(f"{category}_bytes", 0), predicted_bytes)
                 for category, predicted_bytes in states.items() if f"{category}_bytes" in measured]
        held = sum(row[2] for row in found)
        saved = predicted.activations if phase == "after_forward" else 0
        rows += found + [(phase, ACTIVATIONS, measured.get("live_bytes", held) - held, saved)]
    return rows


def estimate_gap(run: RunData) -> list[Finding]:
    error, measured_mb = run.summary.get("peak_error_pct"), run.summary.get("peak_alloc_max_mb")
    if not is_number(error) or abs(error) <= GAP_PCT or not is_number(measured_mb):
        return []
    predicted = prediction(run)
    if predicted is None or abs(measured_mb * 2**20 - predicted.peak) < GAP_FLOOR:
        return []
    evidence = [f"measured peak {measured_mb:.1f} MB, predicted {mb(predicted.peak)} at the {predicted.moment}: "
                f"{error:+.0f}%"]
    peaks = {row["phase"]: row["peak_bytes"] for row in run.summary.get("phases") or [] if is_number(row.get("peak_bytes"))}
    if peaks:
        evidence.append("peak since the step began, at each sample of the last step: "
                        + ", ".join(f"{phase.replace('_', ' the ')} {mb(peak)}" for phase, peak in peaks.items()))
    rows = category_gaps(run, predicted)
    table = [["when", "category", "measured", "predicted"]] + [[when, name, mb(got), mb(expected)]
                                                              for when, name, got, expected in rows]
    missed = sorted((row for row in rows if abs(row[2] - row[3]) >= NOTED_SHARE * measured_mb * 2**20),
                    key=lambda row: -abs(row[2] - row[3]))
    evidence += [f"{name} {when.replace('_', ' the ')}: measured {mb(got)}, predicted {mb(expected)}"
                 for when, name, got, expected in missed]
    if missed:
        names = ", ".join(dict.fromkeys(row[1] for row in missed))
        cause = (f"the prediction's {names} do not match this run's (nano's memory_breakdown against the formula): a "
                 "setting the prediction does not model changes them (the persistence threshold, data_types, ZeRO++ "
                 "or offload keys, a model it does not know)")
    elif rows:
        cause = ("the categories match at the sampled moments, so the difference is held between them: a temporary "
                 "the prediction does not model")
    else:
        cause = "the run holds memory the prediction does not model (no per-category figures for this impl)"
    return [Finding(
        "estimate-gap", f"{run.label}: the measured peak is {abs(error):.0f}% {'below' if error > 0 else 'above'} "
        "the prediction", evidence, cause,
        "trust the measured figure for this configuration; `zero-lab explain --measure` sets nano's formula beside a "
        "measured step, category by category, to find what the prediction leaves out",
        runs=[run.name], table=table if rows else [],
        figures={"measured_peak_mb": measured_mb, "predicted_peak_bytes": predicted.peak, "error_pct": error,
                 "categories": [{"when": when, "category": name, "measured": got, "predicted": expected}
                                for when, name, got, expected in rows]})]


def buckets_dominate(run: RunData) -> list[Finding]:
    measured_mb, bucket = run.summary.get("peak_alloc_max_mb"), run.log.zero.get("reduce_bucket_size")
    shape = run.shape()
    if (run.impl not in ("nano", "official") or run.stage is None or not is_number(measured_mb)
            or not is_number(bucket) or shape is None):
        return []
    communication = run.log.zero.get("communication_data_type")
    communication = communication if communication in BYTES_OF_PRECISION else run.precision
    rules = fetch_rules(run)
    buffers = communication_buffer_bytes(shape, run.stage, run.precision, run.impl, int(bucket), communication, rules)
    measured = measured_mb * 2**20
    if buffers < BUCKET_SHARE * measured:
        return []
    smaller = shape.hidden_size * shape.hidden_size  # Hugging Face's "auto" reduce_bucket_size
    changed = prediction(run, zero={**run.log.zero, "reduce_bucket_size": smaller})
    after = communication_buffer_bytes(shape, run.stage, run.precision, run.impl, smaller, communication, rules)
    states = run.summary.get("states_formula_mb")
    what = ("its first gradient bucket" if run.impl == "nano" else
            f"its {bucket}-element {'reduce bucket and prefetch copy' if run.stage == 3 else 'gradient staging buffer'},"
            " allocated at start-up")
    return [Finding(
        "buckets-dominate", f"{run.label}: communication buffers are {buffers / measured:.0%} of the peak",
        [f"{run.impl} holds {what}: {mb(buffers)} of the measured peak {measured_mb:.1f} MB",
         f"the model states (nano's formula for this cell): {states:.1f} MB" if is_number(states) else
         "the model states: unknown",
         f"reduce_bucket_size={bucket} elements; the model has {shape.hidden_size}-wide layers"],
        "the buffers are sized by reduce_bucket_size (and stage3_prefetch_bucket_size), not by the model: DeepSpeed's "
        "defaults suit billions of parameters, and for a small model they outweigh the model itself",
        f"set reduce_bucket_size: {smaller} (hidden_size squared, Hugging Face's \"auto\"): buffers {mb(after)}, "
        f"predicted peak {mb(changed.peak) if changed else '?'}" + (" (stage3_prefetch_bucket_size too, for the "
                                                                     "prefetch copy)" if run.stage == 3 else ""),
        runs=[run.name], figures={"buffer_bytes": buffers, "measured_peak_mb": measured_mb, "states_formula_mb": states,
                                  "suggested_reduce_bucket_size": smaller,
                                  "predicted_peak_bytes_with_it": changed.peak if changed else None})]
