"""A comparison in pandas: runs side by side per cell, their deltas, per-step loss gaps, a verdict.

A *cell* here is one (world size, stage); each cell runs every impl. Deltas are `candidate -
baseline` (by default nano - official, the seed's sign convention), percentages relative to the
baseline. The input is the runs' summaries (summary.json: a row, plus the per-step `losses`).

Phase 1: order the runs by cell, then by impl order. In a cell, the baseline is the run of the
         baseline impl (`--baseline`, default official) that logged steps, or else the second
         run that did; every other run that logged steps is a candidate against it
         (`against_baseline`), and each pair of candidates is compared too, so loss parity is
         checked pairwise (nano vs fsdp2 beside nano vs official and fsdp2 vs official).
Phase 2: `cell_deltas`: each pair merged on the cell; differences, percentages of the
         baseline and ratios, column by column (missing where an operand is missing, or a
         percentage's or ratio's baseline is 0).
Phase 3: `step_loss_gaps`: both runs' per-step losses joined on (cell, step), so only the steps both
         logged count; a cell's gap is the largest |difference|, infinite when a loss is NaN.
Phase 4: the verdict's rules (`metrics`): loss parity per cell, memory regressions, failed runs,
         an interruption, exact resume.
"""

from __future__ import annotations

import math

import pandas as pd

from zero_lab.analysis import rundir
from zero_lab.analysis.logparse import MEMORY_FIELDS
from zero_lab.analysis.metrics import loss_parity, resolve_loss_tol, verdict
from zero_lab.analysis.tables import plain

CELL = ["world_size", "stage"]
# What a delta reads of each run.
COMPARED = ("steps", "loss_last", *MEMORY_FIELDS, "step_ms", "comm_mb", "comm_wire_mb")
# summary.json keys too bulky for a row: per-step losses, headers, configs, the environment, the last
# step's phase samples.
SUMMARY_ONLY = {"losses", "zero", "model", "comm", "config", "env", "command", "phases"}


def run_frame(summaries: list[dict]) -> pd.DataFrame:
    """One row per run, indexed by its position in `summaries`: the cell, the impl and the figures compared."""
    frame = pd.DataFrame.from_records(
        [{"world_size": s["world_size"], "stage": s["stage"], "impl": s["impl"], **{k: s.get(k) for k in COMPARED}}
         for s in summaries], columns=[*CELL, "impl", *COMPARED])
    return frame.astype({name: "float64" for name in COMPARED})


def loss_frame(summaries: list[dict]) -> pd.DataFrame:
    """One row per (run, step) with its loss; `run` is the position in `summaries`."""
    records = [(run, step, loss) for run, summary in enumerate(summaries)
               for step, loss in rundir.losses_of(summary).items()]
    return pd.DataFrame.from_records(records, columns=["run", "step", "loss"]).astype(
        {"run": "int64", "step": "int64", "loss": "float64"})


def largest_gap(gaps: pd.Series) -> float:
    """The largest |loss difference|; infinite when one is NaN, so no tolerance passes it."""
    return math.inf if gaps.isna().any() else gaps.max()


def step_loss_gaps(losses: pd.DataFrame, candidates: pd.Series, baselines: pd.Series) -> pd.Series:
    """Phase 3: per pair (candidate run i, baseline run j), the largest loss gap over the steps both
    logged; NaN where they share no step. Indexed like `candidates`."""
    pairs = pd.DataFrame({"pair": candidates.index, "run": candidates.values, "baseline_run": baselines.values})
    candidate = pairs.merge(losses, on="run")
    baseline = losses.rename(columns={"run": "baseline_run", "loss": "baseline_loss"})
    aligned = candidate.merge(baseline, on=["baseline_run", "step"])
    gaps = (aligned["loss"] - aligned["baseline_loss"]).abs().groupby(aligned["pair"]).agg(largest_gap)
    return gaps.reindex(candidates.index)


DEFAULT_BASELINE = "official"


def compared_pairs(measured: pd.DataFrame, baseline_impl: str) -> pd.DataFrame:
    """Phase 1: (run, baseline run, against_baseline) per pair of measured runs in each cell."""
    pairs = []
    for _, cell in measured.groupby(CELL, sort=False):
        if len(cell) < 2:
            continue
        chosen = cell[cell["impl"] == baseline_impl]
        baseline = int(chosen["run"].iloc[0] if len(chosen) else cell["run"].iloc[1])
        candidates = [int(run) for run in cell["run"] if run != baseline]
        pairs += [(run, baseline, True) for run in candidates]
        pairs += [(first, second, False) for index, first in enumerate(candidates) for second in candidates[index + 1:]]
    return pd.DataFrame(pairs, columns=["run", "run_baseline", "against_baseline"])


def cell_deltas(summaries: list[dict], loss_tol: float, baseline_impl: str = DEFAULT_BASELINE) -> pd.DataFrame:
    """Phase 2: one row per pair of measured runs of a cell (summaries in Phase 1's order)."""
    runs = run_frame(summaries).rename_axis("run").reset_index()
    measured = runs[runs["steps"] > 0]
    chosen = compared_pairs(measured, baseline_impl)
    # inner merges keep the left frame's order: Phase 1's pairs, cell by cell
    pairs = chosen.merge(runs, on="run").merge(runs.drop(columns=CELL).add_suffix("_baseline"), on="run_baseline")
    deltas = pairs[CELL].assign(impl=pairs["impl"], baseline=pairs["impl_baseline"],
                                against_baseline=pairs["against_baseline"])
    for name in MEMORY_FIELDS:
        change = pairs[name] - pairs[f"{name}_baseline"]
        deltas[f"{name}_delta"] = change
        deltas[f"{name}_delta_pct"] = (100.0 * change / pairs[f"{name}_baseline"]).where(pairs[f"{name}_baseline"] != 0)
    deltas["loss_last_delta"] = pairs["loss_last"] - pairs["loss_last_baseline"]
    deltas["max_step_loss_delta"] = step_loss_gaps(loss_frame(summaries), pairs["run"], pairs["run_baseline"])
    deltas["step_time_ratio"] = ratio(pairs["step_ms"], pairs["step_ms_baseline"])
    deltas["comm_mb_delta"] = pairs["comm_mb"] - pairs["comm_mb_baseline"]
    deltas["comm_wire_ratio"] = ratio(pairs["comm_wire_mb"], pairs["comm_wire_mb_baseline"])
    deltas["loss_parity"] = [loss_parity(plain(gap), loss_tol) for gap in deltas["max_step_loss_delta"]]
    return deltas


def ratio(candidate: pd.Series, baseline: pd.Series) -> pd.Series:
    """candidate / baseline; missing where the baseline is 0."""
    return (candidate / baseline).where(baseline != 0)


def delta_records(deltas: pd.DataFrame) -> list[dict[str, object]]:
    """Plain dicts for compare.json: None where a figure is missing. The last losses are always
    there (both runs logged steps), so their difference stays NaN when a loss was NaN."""
    records = []
    for row in deltas.to_dict("records"):
        record = {key: plain(value) for key, value in row.items()}
        record["loss_last_delta"] = float(row["loss_last_delta"])
        records.append(record)
    return records


def resume_checks(straight: list[dict], resumed: list[dict]) -> list[dict]:
    """`compare --resume-check`: per cell, the resumed run's losses against the uninterrupted
    run's over the steps after the checkpoint, joined on the step; exact means equal as logged
    (9 significant digits)."""
    key = ("world_size", "stage", "impl")
    reference = {tuple(summary[name] for name in key): index for index, summary in enumerate(straight)}
    losses = loss_frame([*straight, *resumed])
    checks = []
    for index, run in enumerate(resumed):
        mine = losses[losses["run"] == len(straight) + index]
        theirs = losses[losses["run"] == reference.get(tuple(run[name] for name in key), -1)]
        aligned = mine.merge(theirs, on="step", suffixes=("", "_reference")).sort_values("step")
        gap = plain(largest_gap((aligned["loss"] - aligned["loss_reference"]).abs())) if len(aligned) else None
        common = [int(step) for step in aligned["step"]]
        checks.append({"world_size": run["world_size"], "stage": run["stage"], "impl": run["impl"],
                       "steps_compared": common, "max_step_loss_delta": gap,
                       "exact": bool(common) and run["status"] == "ok" and gap == 0.0})
    return checks


def build_comparison(
    summaries: list[dict],
    impl_order: list[str],
    loss_tol: float | None = None,
    fail_on_regression: float | None = None,
    interrupted_by: str | None = None,
    resumed: list[dict] | None = None,
    baseline: str = DEFAULT_BASELINE,
) -> dict[str, object]:
    """rows, deltas and verdict from run summaries (each a row plus its per-step `losses`).

    In each cell the run of `baseline` is the baseline (without one: the second impl of impl_order
    present), every other impl a candidate against it, and the candidates are paired among
    themselves for loss parity. interrupted_by: the signal that cut the comparison short, if one did.
    """
    rank = {impl: index for index, impl in enumerate(impl_order)}
    ordered = sorted(  # Phase 1
        summaries, key=lambda s: (s["world_size"], s["stage"], rank.get(s["impl"], len(rank)), s["impl"])
    )
    tolerance = resolve_loss_tol(loss_tol, [s.get("precision", "fp32") for s in ordered])
    rows = [{key: value for key, value in summary.items() if key not in SUMMARY_ONLY} for summary in ordered]
    deltas = delta_records(cell_deltas(ordered, tolerance, baseline))
    resumes = None if resumed is None else resume_checks(ordered, resumed)
    comparison = {
        "rows": rows,
        "baseline": baseline,
        "deltas": deltas,
        "verdict": verdict(rows, deltas, tolerance, fail_on_regression, interrupted_by, resumes),  # Phase 4
    }
    if resumes is not None:
        comparison["resume_checks"] = resumes
    return comparison
