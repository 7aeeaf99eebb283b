"""A comparison in pandas: runs side by side per cell, their deltas, per-step loss gaps, a verdict.

A *cell* here is one (world size, stage); each cell runs every impl, once or (`compare --repeat N`)
N times. Deltas are `candidate - baseline` (by default nano - official, the seed's sign
convention), percentages relative to the baseline. The input is the runs' summaries (summary.json:
a row, plus the per-step `losses` and `step_times_ms`).

Phase 1: order the runs by cell, then by impl order, each impl's repeats in the order they ran.
         In a cell, the baseline is the first run of the baseline impl (`--baseline`, default
         official) that logged steps, or else of the second impl that did; the first run of every
         other impl that logged steps is a candidate against it (`against_baseline`), and each
         pair of candidates is compared too, so loss parity is checked pairwise (nano vs fsdp2
         beside nano vs official and fsdp2 vs official).
Phase 2: `cell_deltas`: each pair merged on the cell; differences, percentages of the
         baseline and ratios, column by column (missing where an operand is missing, or a
         percentage's or ratio's baseline is 0).
Phase 3: `step_loss_gaps`: both runs' per-step losses joined on (cell, step), so only the steps both
         logged count; a cell's gap is the largest |difference|, infinite when a loss is NaN; and
         the real updates those losses reflect (`pair_updates_compared`, `runs.updates`): losses
         that agree before any real update say nothing of the optimizer ("not tested").
Phase 4: `step_time_table`: per cell and impl, the step times of all its runs after each run's
         start-up, pooled: their median and quartiles; each pair's ratio of medians gets its
         bootstrap interval (over runs, then steps) and verdict (`step_times`).
Phase 5: the verdict's rules (`metrics`): loss parity per cell, memory and step-time regressions,
         failed runs, an interruption, exact resume.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pandas as pd

from zero_lab.analysis.runs import rundir
from zero_lab.analysis.runs.speed import step_times
from zero_lab.analysis.runs.logparse import MEMORY_FIELDS
from zero_lab.analysis.compare.metrics import loss_parity, resolve_loss_tol, verdict
from zero_lab.analysis.runs.tables import plain
from zero_lab.analysis.runs.updates import updates_compared

CELL = ["world_size", "stage"]
# What a delta reads of each run.
COMPARED = ("steps", "loss_last", *MEMORY_FIELDS, "step_ms", "comm_mb", "comm_wire_mb")
# summary.json keys too bulky for a row: per-step losses and times, headers, configs, the environment,
# the last step's phase samples.
SUMMARY_ONLY = {"losses", "step_times_ms", "updates", "zero", "model", "comm", "config", "env", "command", "phases"}


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


def aligned_losses(losses: pd.DataFrame, candidates: pd.Series, baselines: pd.Series) -> pd.DataFrame:
    """Phase 3: per pair (candidate run i, baseline run j), one row per step both logged: the pair's
    index, the step, both losses."""
    pairs = pd.DataFrame({"pair": candidates.index, "run": candidates.values, "baseline_run": baselines.values})
    candidate = pairs.merge(losses, on="run")
    baseline = losses.rename(columns={"run": "baseline_run", "loss": "baseline_loss"})
    return candidate.merge(baseline, on=["baseline_run", "step"])


def step_loss_gaps(aligned: pd.DataFrame, index: pd.Index) -> pd.Series:
    """Phase 3: per pair, the largest loss gap over the steps both logged; NaN where they share no step."""
    gaps = (aligned["loss"] - aligned["baseline_loss"]).abs().groupby(aligned["pair"]).agg(largest_gap)
    return gaps.reindex(index)


def pair_updates_compared(summaries: list[dict], aligned: pd.DataFrame, pairs: pd.DataFrame) -> list[int]:
    """Phase 3: per pair, the real updates its compared losses reflect (`runs.updates`): those before
    the last step both logged that were real in both runs."""
    last = aligned.groupby("pair")["step"].max().reindex(pairs.index)
    return [updates_compared(plain(step), summaries[run], summaries[baseline])
            for step, run, baseline in zip(last, pairs["run"], pairs["run_baseline"])]


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


def cell_deltas(summaries: list[dict], loss_tol: float, baseline_impl: str,
                timed: dict[tuple[int, int, str], ImplSteps]) -> pd.DataFrame:
    """Phase 2: one row per pair of measured impls of a cell (summaries in Phase 1's order; timed:
    Phase 4's step times of every cell and impl)."""
    runs = run_frame(summaries).rename_axis("run").reset_index()
    measured = runs[runs["steps"] > 0].drop_duplicates([*CELL, "impl"])  # each impl's first run
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
    aligned = aligned_losses(loss_frame(summaries), pairs["run"], pairs["run_baseline"])
    deltas["max_step_loss_delta"] = step_loss_gaps(aligned, pairs.index)
    deltas["updates_compared"] = pd.Series(pair_updates_compared(summaries, aligned, pairs), index=pairs.index,
                                           dtype="int64")
    times = pd.DataFrame.from_records(
        [step_time_ratio(timed[(*cell, impl)], timed[(*cell, baseline)])
         for *cell, impl, baseline in pairs[[*CELL, "impl", "impl_baseline"]].itertuples(index=False)],
        columns=STEP_TIME_DELTAS, index=pairs.index)
    deltas[list(STEP_TIME_DELTAS)] = times
    deltas["comm_mb_delta"] = pairs["comm_mb"] - pairs["comm_mb_baseline"]
    deltas["comm_wire_ratio"] = ratio(pairs["comm_wire_mb"], pairs["comm_wire_mb_baseline"])
    deltas["loss_parity"] = [loss_parity(plain(gap), loss_tol, updates)
                             for gap, updates in zip(deltas["max_step_loss_delta"], deltas["updates_compared"])]
    return deltas


@dataclass(frozen=True)
class ImplSteps:
    """Phase 4: one impl's step times in one cell, its runs pooled."""

    start_up_steps: list[int]  # per run that logged a step time, how many leading steps were start-up
    runs: list[list[float]]  # per such run, its steady step times
    step_ms: float | None  # their median, pooled; without per-step times, its first run's summary step_ms
    spread: step_times.Spread | None  # their median and quartiles, pooled


def step_time_table(summaries: list[dict]) -> dict[tuple[int, int, str], ImplSteps]:
    """Phase 4: (world size, stage, impl) -> its runs' step times after start-up, pooled."""
    grouped: dict[tuple[int, int, str], list[dict]] = {}
    for summary in summaries:
        grouped.setdefault((summary["world_size"], summary["stage"], summary["impl"]), []).append(summary)
    table = {}
    for key, runs in grouped.items():
        series = [times for run in runs if (times := [ms for _, ms in sorted(rundir.step_times_of(run).items())])]
        steady = [step_times.steady_times(times) for times in series]
        spread = step_times.spread([ms for times in steady for ms in times])
        first_measured = next((run.get("step_ms") for run in runs if run.get("steps")), None)
        table[key] = ImplSteps([step_times.start_up_steps(times) for times in series], steady,
                               spread.median if spread else first_measured, spread)
    return table


STEP_TIME_DELTAS = ("step_time_ratio", "step_time_ratio_low", "step_time_ratio_high", "step_time_verdict")


def step_time_ratio(candidate: ImplSteps, baseline: ImplSteps) -> tuple[float | None, float | None, float | None,
                                                                       str | None]:
    """Phase 4 for a pair: (ratio of the medians, interval low, high, verdict); None where unknown."""
    if candidate.step_ms is None or not baseline.step_ms:
        return None, None, None, None
    interval = step_times.ratio_interval(candidate.runs, baseline.runs)
    low, high = interval or (None, None)
    return candidate.step_ms / baseline.step_ms, low, high, step_times.time_verdict(interval)


def step_time_records(timed: dict[tuple[int, int, str], ImplSteps]) -> list[dict[str, object]]:
    """compare.json's `step_times`: per cell and impl, what its step time rests on."""
    return [{"world_size": world_size, "stage": stage, "impl": impl, "runs": len(steps.runs),
             "steps": sum(len(run) for run in steps.runs),
             "start_up_steps": steps.start_up_steps, "step_ms": plain(steps.step_ms),
             "step_ms_q1": steps.spread.q1 if steps.spread else None,
             "step_ms_q3": steps.spread.q3 if steps.spread else None}
            for (world_size, stage, impl), steps in timed.items()]


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
    (9 significant digits); updates_compared counts the real updates the resumed run made itself
    that those losses show (0: the resume restored the weights, but nothing shows its optimizer
    states)."""
    key = ("world_size", "stage", "impl")
    reference: dict[tuple, int] = {}
    for index, summary in enumerate(straight):  # with --repeat, each impl's first run
        reference.setdefault(tuple(summary[name] for name in key), index)
    losses = loss_frame([*straight, *resumed])
    checks = []
    for index, run in enumerate(resumed):
        mine = losses[losses["run"] == len(straight) + index]
        theirs = losses[losses["run"] == reference.get(tuple(run[name] for name in key), -1)]
        aligned = mine.merge(theirs, on="step", suffixes=("", "_reference")).sort_values("step")
        gap = plain(largest_gap((aligned["loss"] - aligned["loss_reference"]).abs())) if len(aligned) else None
        common = [int(step) for step in aligned["step"]]
        straight_run = straight[reference[tuple(run[name] for name in key)]] if common else {}
        updates = updates_compared(max(common), run, straight_run, first_step=min(common)) if common else 0
        checks.append({"world_size": run["world_size"], "stage": run["stage"], "impl": run["impl"],
                       "steps_compared": common, "max_step_loss_delta": gap,
                       # the resumed run's own real updates that its compared losses show
                       "updates_compared": updates,
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
    """rows, deltas, step times and verdict from run summaries (each a row plus its per-step
    `losses` and `step_times_ms`; an impl's repeats of a cell in the order they ran).

    In each cell the run of `baseline` is the baseline (without one: the second impl of impl_order
    present), every other impl a candidate against it, and the candidates are paired among
    themselves for loss parity. interrupted_by: the signal that cut the comparison short, if one did.
    """
    rank = {impl: index for index, impl in enumerate(impl_order)}
    ordered = sorted(  # Phase 1
        summaries, key=lambda s: (s["world_size"], s["stage"], rank.get(s["impl"], len(rank)), s["impl"])
    )
    tolerance = resolve_loss_tol(loss_tol, [s.get("precision", "fp32") for s in ordered])
    repeats: dict[tuple, int] = {}
    rows = []
    for summary in ordered:
        key = (summary["world_size"], summary["stage"], summary["impl"])
        repeats[key] = repeats.get(key, 0) + 1
        rows.append({**{name: value for name, value in summary.items() if name not in SUMMARY_ONLY},
                     "repeat": repeats[key]})
    timed = step_time_table(ordered)  # Phase 4
    deltas = delta_records(cell_deltas(ordered, tolerance, baseline, timed))
    resumes = None if resumed is None else resume_checks(ordered, resumed)
    comparison = {
        "rows": rows,
        "baseline": baseline,
        "deltas": deltas,
        "step_times": step_time_records(timed),
        "verdict": verdict(rows, deltas, tolerance, fail_on_regression, interrupted_by, resumes),  # Phase 5
    }
    if resumes is not None:
        comparison["resume_checks"] = resumes
    return comparison
