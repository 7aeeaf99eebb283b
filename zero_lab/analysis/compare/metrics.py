"""The verdict's rules: when a comparison passes, and the exit code it ends with.

The numbers they judge (per-run summaries, deltas, per-step loss gaps) are computed in pandas by
`analysis.runs.tables` and `analysis.compare.comparison`; this module only decides:
    `resolve_loss_tol`: the loss tolerance (explicit, else the loosest default of the precisions);
    `loss_parity`: a cell's losses agree when its largest per-step gap is within the tolerance,
                   over at least one real update (else "not tested": `analysis.runs.updates`);
    `memory_regressions`: the memory figures whose increase over the baseline exceeds the gate;
    `step_time_regression`: a step time slower than the baseline's beyond noise and beyond the gate;
    `verdict`: the gates together: 3 a run failed, 1 a gate failed, 0 fine; an interruption (with
               the exit code the command ends with: `signals.interrupted_exit_code`) overrides them all;
               a cell that never started (`not_run`: its world size needs more GPUs than are
               visible; `refused`: predicted not to fit in memory) fails nothing and is listed.
"""

from __future__ import annotations

from zero_lab.analysis.runs.logparse import MEMORY_FIELDS
from zero_lab.analysis.runs.rundir import NEVER_STARTED
from zero_lab.signals import interrupted_exit_code

# Default loss tolerance per precision: fp32 engines agree to ~1e-6 here, half precision to ~1e-2.
DEFAULT_LOSS_TOL = {"fp32": 1e-4, "bf16": 5e-2, "fp16": 5e-2}


def loss_parity(max_step_loss_delta: float | None, loss_tol: float, updates_compared: int = 1) -> bool | None:
    """No common step gives no parity; a NaN loss gives an infinite gap, which never passes. Losses
    within the tolerance that reflect no real update (`runs.updates`) are None: not tested."""
    if max_step_loss_delta is None or max_step_loss_delta > loss_tol:
        return False
    return True if updates_compared > 0 else None


def updates_words(count: int) -> str:
    return f"{count} update{'' if count == 1 else 's'}"


def parity_text(verdict: dict) -> str:
    """The verdict's loss parity in words: "yes over N updates", "NO", "not tested", or "n/a" when no
    cell had two impls that logged a step (one impl run, or the others failed before their first)."""
    parity, updates = verdict["loss_parity"], verdict.get("updates_compared")
    if parity is True:
        return f"yes over {updates_words(updates)}"
    return "NO" if parity is False else "n/a (no cell has two impls that logged a step)" if updates is None else \
        "not tested"


def pair_parity_text(delta: dict) -> str:
    """One pair's loss parity: "yes (N updates)", "NO" or "not tested (0 updates)"."""
    if delta["loss_parity"] is None:
        return "not tested (0 updates)"
    return f"yes ({updates_words(delta['updates_compared'])})" if delta["loss_parity"] else "NO"


def pair_parity_note(delta: dict) -> str:
    """The same beside a loss gap: "parity over N updates", "NO parity" or "parity not tested"."""
    if delta["loss_parity"] is None:
        return "parity not tested"
    return f"parity over {updates_words(delta['updates_compared'])}" if delta["loss_parity"] else "NO parity"


# Why a comparison's losses compared no update, and what to do: said under the verdict.
NOT_TESTED_WHY = ("not tested: the losses compared come before any update with a learning rate above 0 that moved "
                  "the parameters (the loss of step k reflects updates 1 .. k-1; the harness's WarmupLR starts "
                  "at 0, so its first two updates change nothing): run at least 4 steps")


def memory_regressions(delta: dict, threshold_pct: float) -> list[str]:
    """The memory fields whose increase over the baseline exceeds threshold_pct."""
    return [
        name
        for name in MEMORY_FIELDS
        if (pct := delta.get(f"{name}_delta_pct")) is not None and pct > threshold_pct
    ]


def step_time_regression(delta: dict, threshold_pct: float) -> bool:
    """The step time regressed: its verdict is `slower` (the whole interval above 1.0) and the
    ratio exceeds 1 + threshold_pct / 100. A ratio within noise never fails the gate."""
    ratio = delta.get("step_time_ratio")
    return delta.get("step_time_verdict") == "slower" and ratio is not None and ratio > 1 + threshold_pct / 100


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
        if row["status"] not in ("ok", "interrupted", *NEVER_STARTED)
    ]
    # cells that never started (more GPUs than visible): said, not failed
    not_run = [f"world_size={row['world_size']} stage={row['stage']} impl={row['impl']}: not run, {row['error']}"
               for row in rows if row["status"] in NEVER_STARTED]
    parity_failures = [
        f"world_size={d['world_size']} stage={d['stage']} ({d['impl']} vs {d['baseline']}): max step loss delta "
        f"{d['max_step_loss_delta']} > {loss_tol}"
        for d in deltas
        if d["loss_parity"] is False
    ]
    not_tested = [f"world_size={d['world_size']} stage={d['stage']} ({d['impl']} vs {d['baseline']}): losses "
                  f"within {loss_tol} over 0 updates" for d in deltas if d["loss_parity"] is None]
    regressions, time_regressions = [], []
    if fail_on_regression is not None:
        for d in deltas:
            if not d.get("against_baseline", True):  # a pair of candidates: loss parity only
                continue
            for name in memory_regressions(d, fail_on_regression):
                regressions.append(
                    f"world_size={d['world_size']} stage={d['stage']}: {name} "
                    f"{d[f'{name}_delta_pct']:+.2f}% > {fail_on_regression}%"
                )
            if step_time_regression(d, fail_on_regression):
                time_regressions.append(
                    f"world_size={d['world_size']} stage={d['stage']}: step time {d['impl']} / {d['baseline']} "
                    f"{d['step_time_ratio']:.3f} ({d['step_time_ratio_low']:.3f}-{d['step_time_ratio_high']:.3f}), "
                    f"slower by more than {fail_on_regression}%"
                )
    resume_failures = [f"world_size={check['world_size']} stage={check['stage']} impl={check['impl']}: resumed "
                       f"losses differ from the uninterrupted run's by {check['max_step_loss_delta']} over steps "
                       f"{check['steps_compared']}" for check in resumes or [] if not check["exact"]]
    if interrupted_by:
        exit_code = interrupted_exit_code(interrupted_by)
    elif failed_runs:
        exit_code = 3
    elif parity_failures or regressions or time_regressions or resume_failures:
        exit_code = 1
    else:
        exit_code = 0
    return {
        "ok": exit_code == 0,
        "exit_code": exit_code,
        "interrupted_by": interrupted_by,
        # True only when every pair agreed over at least one real update; None: one impl, or not tested
        "loss_parity": False if parity_failures else None if not deltas or not_tested else True,
        # the fewest real updates any pair's compared losses reflect (None: nothing compared)
        "updates_compared": min((d["updates_compared"] for d in deltas), default=None),
        "loss_tol": loss_tol,
        "fail_on_regression_pct": fail_on_regression,
        "failed_runs": failed_runs,
        "loss_parity_failures": parity_failures,
        "loss_parity_not_tested": not_tested,
        "memory_regressions": regressions,
        "step_time_regressions": time_regressions,
        # True only over at least one real update made after the resume; None: no resume check, or not tested
        "resume_exact": None if resumes is None else False if resume_failures else (
            None if any(check.get("updates_compared", 1) == 0 for check in resumes) else True),
        "resume_updates_compared": None if not resumes else min(check.get("updates_compared", 1) for check in resumes),
        "resume_failures": resume_failures,
        **({"not_run": not_run} if not_run else {}),
    }


def resolve_loss_tol(loss_tol: float | None, precisions: list[str]) -> float:
    """An explicit tolerance wins; else the loosest default among the precisions compared."""
    if loss_tol is not None:
        return loss_tol
    return max((DEFAULT_LOSS_TOL.get(p, DEFAULT_LOSS_TOL["fp32"]) for p in precisions), default=DEFAULT_LOSS_TOL["fp32"])
