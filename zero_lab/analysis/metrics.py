"""From parsed logs to the numbers a comparison reports: one row per run, one delta per cell, a verdict.

A *cell* is one (world size, stage); each cell runs every impl. Deltas are `candidate - baseline`
(by default nano - official, the seed's sign convention), percentages are relative to the baseline.

Phase 1: `summarize_run` reduces a run's `[opt_step]` rows to one row (memory: max over steps,
         since each step already reports the max over ranks; step time: median without step 1,
         which carries one-time start-up work).
Phase 2: `cell_delta` compares two rows of one cell, step by step for the loss.
Phase 3: `verdict` applies the gates: loss parity per cell and the memory regression threshold;
         an interrupted comparison's verdict says so, with the exit code the command ends with.
"""

from __future__ import annotations

import math
import signal
import statistics

from zero_lab.analysis.logparse import MEMORY_FIELDS, ParsedLog, is_number

ROW_KEYS = (
    "world_size",
    "stage",
    "impl",
    "status",
    "steps",
    "loss_last",
    *MEMORY_FIELDS,
    "step_ms",
    "comm_mb",
    "comm_wire_mb",
)

# summary.json keys too bulky for a row: per-step losses, headers, configs, the environment, the last
# step's phase samples.
SUMMARY_ONLY = {"losses", "zero", "model", "comm", "config", "env", "command", "phases"}

# Default loss tolerance per precision: fp32 engines agree to ~1e-6 here, half precision to ~1e-2.
DEFAULT_LOSS_TOL = {"fp32": 1e-4, "bf16": 5e-2, "fp16": 5e-2}


def column(steps: list[dict], name: str) -> list[float]:
    return [float(row[name]) for row in steps if is_number(row.get(name))]


def max_or_none(values: list[float]) -> float | None:
    return max(values) if values else None


def steady_median(values: list[float]) -> float | None:
    """Median without the first value (start-up work), unless it is the only one."""
    steady = values[1:] if len(values) > 1 else values
    return statistics.median(steady) if steady else None


def summarize_run(parsed: ParsedLog) -> dict[str, object]:
    """The metric part of a row; `status` and the cell keys are the caller's to add."""
    steps = parsed.steps
    losses = column(steps, "loss")
    summary = {
        "steps": len(steps),
        "loss_last": losses[-1] if losses else None,
        **{name: max_or_none(column(steps, name)) for name in MEMORY_FIELDS},
        "step_ms": steady_median(column(steps, "step_ms")),
        "comm_mb": steady_median(column(steps, "comm_mb")),
        "comm_wire_mb": steady_median(column(steps, "comm_wire_mb")),
        # nano only: its own model-state bytes after a step, per place (None for official)
        "states_device_mb": max_or_none(column(steps, "states_device_mb")),
        "states_host_mb": max_or_none(column(steps, "states_host_mb")),
        "tokens_per_s": steady_median(column(steps, "tokens_per_s")),
    }
    return summary


def difference(candidate: float | None, baseline: float | None) -> float | None:
    if candidate is None or baseline is None:
        return None
    return candidate - baseline


def ratio(candidate: float | None, baseline: float | None) -> float | None:
    """candidate / baseline, or None when either is missing or the baseline is 0."""
    return candidate / baseline if candidate is not None and baseline else None


def percent(delta: float | None, baseline: float | None) -> float | None:
    if delta is None or not baseline:
        return None
    return 100.0 * delta / baseline


def max_step_loss_delta(candidate: dict[int, float], baseline: dict[int, float]) -> float | None:
    """Largest |loss difference| over the steps both runs logged; inf when a loss is not finite."""
    common = sorted(set(candidate) & set(baseline))
    if not common:
        return None
    gaps = [abs(candidate[step] - baseline[step]) for step in common]
    return math.inf if any(math.isnan(gap) for gap in gaps) else max(gaps)


def cell_delta(
    candidate: dict,
    baseline: dict,
    candidate_losses: dict[int, float],
    baseline_losses: dict[int, float],
    loss_tol: float,
) -> dict[str, object]:
    """One delta row: candidate minus baseline for memory and loss, and whether the losses agree."""
    delta = {
        "world_size": candidate["world_size"],
        "stage": candidate["stage"],
        "impl": candidate["impl"],
        "baseline": baseline["impl"],
    }
    for name in MEMORY_FIELDS:
        change = difference(candidate.get(name), baseline.get(name))
        delta[f"{name}_delta"] = change
        delta[f"{name}_delta_pct"] = percent(change, baseline.get(name))
    delta["loss_last_delta"] = difference(candidate.get("loss_last"), baseline.get("loss_last"))
    step_gap = max_step_loss_delta(candidate_losses, baseline_losses)
    delta["max_step_loss_delta"] = step_gap
    delta["step_time_ratio"] = ratio(candidate.get("step_ms"), baseline.get("step_ms"))
    delta["comm_mb_delta"] = difference(candidate.get("comm_mb"), baseline.get("comm_mb"))
    delta["comm_wire_ratio"] = ratio(candidate.get("comm_wire_mb"), baseline.get("comm_wire_mb"))
    delta["loss_parity"] = step_gap is not None and step_gap <= loss_tol
    return delta


def memory_regressions(delta: dict, threshold_pct: float) -> list[str]:
    """The memory fields whose increase over the baseline exceeds threshold_pct."""
    return [
        name
        for name in MEMORY_FIELDS
        if (pct := delta.get(f"{name}_delta_pct")) is not None and pct > threshold_pct
    ]


def interrupted_exit_code(signal_name: str) -> int:
    """128 + the signal's number, as a shell reports a process it ended: SIGINT 130, SIGTERM 143, SIGHUP 129."""
    return 128 + signal.Signals[signal_name].value


def verdict(
    rows: list[dict],
    deltas: list[dict],
    loss_tol: float,
    fail_on_regression: float | None,
    interrupted_by: str | None = None,
    resumes: list[dict] | None = None,
) -> dict[str, object]:
    """The gates, and the exit code they imply: 3 a run failed, 1 a gate failed, 0 fine; an
    interruption (interrupted_by, else a row's) overrides them all with 128 + the signal number."""
    interrupted_by = interrupted_by or next(
        (row.get("interrupted_by") or "SIGINT" for row in rows if row["status"] == "interrupted"), None)
    failed_runs = [
        f"world_size={row['world_size']} stage={row['stage']} impl={row['impl']}: {row['status']}"
        + (" (out of memory)" if row.get("failure") == "out_of_memory" else "")
        for row in rows
        if row["status"] not in ("ok", "interrupted")
    ]
    parity_failures = [
        f"world_size={d['world_size']} stage={d['stage']}: max step loss delta "
        f"{d['max_step_loss_delta']} > {loss_tol}"
        for d in deltas
        if not d["loss_parity"]
    ]
    regressions = []
    if fail_on_regression is not None:
        for d in deltas:
            for name in memory_regressions(d, fail_on_regression):
                regressions.append(
                    f"world_size={d['world_size']} stage={d['stage']}: {name} "
                    f"{d[f'{name}_delta_pct']:+.2f}% > {fail_on_regression}%"
                )
    resume_failures = [f"world_size={check['world_size']} stage={check['stage']} impl={check['impl']}: resumed "
                       f"losses differ from the uninterrupted run's by {check['max_step_loss_delta']} over steps "
                       f"{check['steps_compared']}" for check in resumes or [] if not check["exact"]]
    if interrupted_by:
        exit_code = interrupted_exit_code(interrupted_by)
    elif failed_runs:
        exit_code = 3
    elif parity_failures or regressions or resume_failures:
        exit_code = 1
    else:
        exit_code = 0
    return {
        "ok": exit_code == 0,
        "exit_code": exit_code,
        "interrupted_by": interrupted_by,
        "loss_parity": (not parity_failures) if deltas else None,
        "loss_tol": loss_tol,
        "fail_on_regression_pct": fail_on_regression,
        "failed_runs": failed_runs,
        "loss_parity_failures": parity_failures,
        "memory_regressions": regressions,
        "resume_exact": None if resumes is None else not resume_failures,
        "resume_failures": resume_failures,
    }


def resume_checks(straight: list[dict], resumed: list[dict]) -> list[dict]:
    """`compare --resume-check`: per cell, the resumed run's losses against the uninterrupted
    run's over the steps after the checkpoint; exact means equal as logged (9 significant digits)."""
    checks = []
    by_cell = {(s["world_size"], s["stage"], s["impl"]): s for s in straight}
    for run in resumed:
        reference = by_cell.get((run["world_size"], run["stage"], run["impl"]))
        after, before = losses_of(run), losses_of(reference) if reference else {}
        common = sorted(set(after) & set(before))
        delta = max((abs(after[step] - before[step]) for step in common), default=None)
        checks.append({"world_size": run["world_size"], "stage": run["stage"], "impl": run["impl"],
                       "steps_compared": common, "max_step_loss_delta": delta,
                       "exact": bool(common) and run["status"] == "ok" and delta == 0.0})
    return checks


def resolve_loss_tol(loss_tol: float | None, precisions: list[str]) -> float:
    """An explicit tolerance wins; else the loosest default among the precisions compared."""
    if loss_tol is not None:
        return loss_tol
    return max((DEFAULT_LOSS_TOL.get(p, DEFAULT_LOSS_TOL["fp32"]) for p in precisions), default=DEFAULT_LOSS_TOL["fp32"])


def build_comparison(
    summaries: list[dict],
    impl_order: list[str],
    loss_tol: float | None = None,
    fail_on_regression: float | None = None,
    interrupted_by: str | None = None,
    resumed: list[dict] | None = None,
) -> dict[str, object]:
    """rows, deltas and verdict from run summaries (each a row plus its per-step `losses`).

    The first impl of impl_order present in a cell is the candidate, the second the baseline.
    interrupted_by: the signal that cut the comparison short, if one did.
    """
    rank = {impl: index for index, impl in enumerate(impl_order)}
    ordered = sorted(
        summaries, key=lambda s: (s["world_size"], s["stage"], rank.get(s["impl"], len(rank)), s["impl"])
    )
    tolerance = resolve_loss_tol(loss_tol, [s.get("precision", "fp32") for s in ordered])
    rows = [{key: value for key, value in summary.items() if key not in SUMMARY_ONLY} for summary in ordered]
    deltas = []
    cells: dict[tuple[int, int], list[dict]] = {}
    for summary in ordered:
        cells.setdefault((summary["world_size"], summary["stage"]), []).append(summary)
    for cell in cells.values():
        measured = [s for s in cell if s.get("steps")]
        if len(measured) >= 2:
            candidate, baseline = measured[0], measured[1]
            deltas.append(
                cell_delta(candidate, baseline, losses_of(candidate), losses_of(baseline), tolerance)
            )
    resumes = None if resumed is None else resume_checks(ordered, resumed)
    comparison = {
        "rows": rows,
        "deltas": deltas,
        "verdict": verdict(rows, deltas, tolerance, fail_on_regression, interrupted_by, resumes),
    }
    if resumes is not None:
        comparison["resume_checks"] = resumes
    return comparison


def losses_of(summary: dict) -> dict[int, float]:
    """Per-step losses as saved in summary.json (JSON keys are strings)."""
    return {int(step): float(loss) for step, loss in summary.get("losses", {}).items()}
