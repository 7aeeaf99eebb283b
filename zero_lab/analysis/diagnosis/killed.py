"""`rank-killed`: a rank ended by a signal from outside the training, while the others waited for it.

The kernel's out-of-memory killer, a lost node, a scheduler's preemption or a `kill -9` end a rank
with a signal it did not raise itself (SIGKILL, SIGTERM, SIGHUP, SIGINT). That leaves other evidence
than ranks whose collectives part (`mismatch`):
    - its exit: the signal, in torchrun's report of the rank that failed first;
    - its flight record just stops; up to there every rank issued the same collectives, and the
      others hold the next one (they waited in it for a partner that was gone);
    - no rank says "collective mismatch" (gloo's abort when ranks call different collectives).
So the first call where the records part has one signature among the ranks that reached it, and the
ranks missing from it include the one killed.

Phase 1: `RunData.killing_signal`: the signal from outside that ended the failed rank, if one did.
Phase 2: `mismatch.only_missing`: the records part only by a rank that stopped, not by what was called.
Phase 3: `rank_killed(run)`: the finding, with where each rank stood.
"""

from __future__ import annotations

from zero_lab.analysis.diagnosis.finding import Finding
from zero_lab.analysis.diagnosis.mismatch import ABORT_TEXT, described, first_difference, only_missing
from zero_lab.analysis.diagnosis.run_data import RunData


def rank_killed(run: RunData) -> list[Finding]:
    """Phase 3: the finding for a run whose rank a signal from outside ended (none otherwise). A run
    that ran out of memory by the harness's own count is `out-of-memory`'s, not this rule's."""
    sent = run.killing_signal()
    if sent is None or run.summary.get("failure") == "out_of_memory" or run.ranks_saying(ABORT_TEXT):
        return []
    found = first_difference(run.records)
    if found is not None and not only_missing(found[1]):
        return []  # the ranks called different collectives: `collective-mismatch`'s
    failed = run.summary.get("failed_rank")
    who = f"rank {failed}" if failed is not None else "the launch (torchrun's agent, and with it every rank)"
    evidence = [run.ending(), f"{who} ended by {sent.name}, a signal it did not raise itself"]
    if found is not None:
        seq, calls = found
        stopped = sorted(rank for rank, call in calls.items() if call is None)
        evidence.append(f"every rank issued the same first {seq} collectives; at call {seq} rank "
                        f"{', '.join(map(str, stopped))} issued nothing, and the others:")
        evidence += [f"rank {rank}: {described(call)}" for rank, call in sorted(calls.items()) if call is not None]
    evidence.append("no rank reported a collective mismatch")
    return [Finding(
        "rank-killed", f"{run.label}: {who} was killed from outside ({sent.name})", evidence,
        "a signal from outside the training ended the rank: the kernel's out-of-memory killer (the machine ran "
        "out of memory, not the engine's allocator), a lost node, a scheduler's preemption or a kill by hand; "
        "the other ranks then waited in their next collective for it",
        "Find what sent it: the kernel log (`dmesg` or `journalctl -k`: \"Out of memory: Killed process\") and "
        "the run's memory.csv for the out-of-memory killer (then `zero-lab estimate` for a setting that fits), "
        "the scheduler's log for a preemption. Save checkpoints (--save-every) and let torchrun restart the "
        "workers (--max-restarts) so that a lost rank costs only the steps since the last save",
        runs=[run.name], figures={"rank": failed, "signal": sent.name})]
