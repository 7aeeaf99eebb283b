"""`run-failed`: a run that failed, stalled or never finished, for which no other rule names a cause.

Every run that did not end well gets at least one error finding: a rule that reads a cause (a
collective mismatch, a rank killed from outside, an out-of-memory) says why; when none does (a
script that raised, a launcher that died, a stall with no flight record), this one says what is
known: how the run ended, its last lines, and what could not be read. So "0 findings" never stands
for a failed run.

Phase 1: `not_ended_well(run)`: failed, stalled or unfinished (interrupted runs are the user's doing;
         a run refused for bad input said why in its one error line, and nothing is added to it).
Phase 2: `run_failed(run, found)`: the finding, when `found` (this run's findings) holds no error.
"""

from __future__ import annotations

from zero_lab.analysis.diagnosis.finding import ERROR, Finding
from zero_lab.analysis.diagnosis.run_data import RunData

NOT_WELL = ("failed", "stalled", "unfinished")
TAIL_LINES = 5


def not_ended_well(run: RunData) -> bool:
    """Phase 1."""
    return run.summary.get("status") in NOT_WELL


def run_failed(run: RunData, found: list[Finding]) -> list[Finding]:
    """Phase 2: the failure itself, with its evidence, when no other error finding is about this run."""
    if not not_ended_well(run) or any(finding.severity == ERROR and run.name in finding.runs for finding in found):
        return []
    tail = [line for line in str(run.summary.get("log_tail") or "").splitlines() if line.strip()][-TAIL_LINES:]
    evidence = [run.ending(), *(f"last words: {line.strip()}" for line in tail)]
    evidence += [f"could not read: {problem}" for problem in run.unreadable]
    if not run.records:
        evidence.append("no flight record of collectives (logs/collectives-rank<N>.bin): where the ranks stood is "
                        "unknown")
    return [Finding(
        "run-failed", f"{run.label}: {run.ending()}", evidence,
        "no rule of the doctor reads a cause in what this run wrote; its last lines are where to start",
        "read the failed rank's whole output in logs/rank<N>.stderr.log (and console.log for the launcher's); "
        "run it alone to see the traceback: zero-lab run with the same flags",
        runs=[run.name], figures={"status": run.summary.get("status"),
                                  "rank_exit_code": run.summary.get("rank_exit_code")})]
