"""`rank-restarted` and `restart-not-reproduced`: a run that lost a rank and went on (`--max-restarts`).

torchrun restarts every worker when one dies; the harness resumes each new attempt from the newest
complete checkpoint and runs the steps after it again (docs/restarts.md). summary.json keeps the
restarts (`analysis.runs.restart_history`): which rank was lost, how it ended, after which step, and the step the
next attempt resumed from; and how far each repeated step's loss lay from its first run.

`rank-restarted` (info): each restart, in words, and what it cost in repeated steps.
`restart-not-reproduced` (warning): a repeated step's loss differs from its first run, so the resumed
    run is not the run that would have been: something the checkpoint does not hold (a random
    state, the data position) or a nondeterministic kernel changed it.
"""

from __future__ import annotations

from zero_lab.analysis.diagnosis.finding import Finding
from zero_lab.analysis.diagnosis.run_data import RunData


def how_it_ended(event: dict) -> str:
    """'was killed by SIGKILL' or 'exited with 7' (torchrun's exit code of the lost worker)."""
    if event.get("signal"):
        return f"was killed by {event['signal']}"
    return f"exited with {event.get('exit_code')}" if event.get("exit_code") is not None else "ended"


def restart_line(event: dict) -> str:
    """One restart in words: who was lost, when, and where the next attempt began."""
    resumed = event.get("resumed_from_step") or 0
    start = f"the checkpoint of step {resumed}" if resumed else "step 1 (no checkpoint had been saved)"
    after = f" after step {event['after_step']}" if event.get("after_step") is not None else ""
    return (f"attempt {event['attempt']}: rank {event.get('rank')} {how_it_ended(event)}{after}; "
            f"every rank restarted from {start}")


def rank_restarted(run: RunData) -> list[Finding]:
    """Both findings for one run: the restarts it survived, and whether the repeated steps agreed."""
    events = run.summary.get("restart_events") or []
    if not events:
        return []
    repeated = run.summary.get("repeated_steps") or []
    difference = run.summary.get("repeated_loss_max_diff")
    evidence = [restart_line(event) for event in events]
    evidence.append(f"steps run twice: {', '.join(map(str, repeated)) or 'none'}"
                    + (f"; the largest difference between a repeated step's losses: {difference:g}"
                       if difference is not None else ""))
    figures = {"restarts": len(events), "repeated_steps": repeated, "repeated_loss_max_diff": difference}
    found = [Finding(
        "rank-restarted", f"{run.label} lost a rank and restarted {len(events)} time(s)", evidence,
        "a worker process ended (a signal: the kernel's OOM killer, a node going away, someone's kill; or an "
        "exit code: its error is in logs/rank<k>.stderr.log), and --max-restarts let torchrun restart every rank",
        "nothing to do if the run finished; to repeat fewer steps after a loss, save more often (--save-every K)",
        [run.name], figures)]
    if difference:
        found.append(Finding(
            "restart-not-reproduced", f"{run.label}: a step repeated after a restart did not reproduce its loss",
            evidence[-1:], "the restarted attempt did not compute what the first did: the checkpoint does not hold "
            "everything the step depends on (a random state, the data position), or a kernel is nondeterministic",
            "compare the run with one that never failed; docs/restarts.md lists what a checkpoint carries",
            [run.name], figures))
    return found
