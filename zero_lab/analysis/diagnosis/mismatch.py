"""`collective-mismatch`: ranks that stalled or failed while their sequences of collectives differ.

Not when the records part only because a rank stopped, killed from outside, out of memory or
stalled (`killed`: `rank-killed`; `memory`'s `out-of-memory`; `failed`: `run-failed`): then no rank
called another collective.

Every rank of a process group must issue the same collectives in the same order: the n-th call of
one rank meets the n-th call of every other. When they differ (one rank runs a module the others
skip, and at stage 3 that module's parameters are gathered), the backend either hangs, each rank
waiting for a partner that never comes, or aborts (gloo: `EnforceNotMet ... Is there a distributed
collective mismatch in your code?`, then SIGABRT). The flight records (`collective_record`) say
what each rank called, numbered in its own order.

Phase 1: line the ranks' records up by call number, over the calls every record still holds.
Phase 2: the first call number where their op, payload bytes or dtype differ, or where some rank
         issued nothing (the others went on without it); each rank's call there, and where it was.
Phase 3: the likely cause from where the ranks were: a module (stage 3's unit labels, or the
         engine call) that some ranks ran, or work between steps that only some ranks did.
With `--check-collectives` (torch's TORCH_DISTRIBUTED_DEBUG=DETAIL) every collective is first
checked across the ranks, and the first one that differs raises on every rank, naming each rank's
call ("Detected mismatch between collectives on ranks"); the evidence adds what torch saw and the
Python frame that issued each rank's call (`torch_check`).
"""

from __future__ import annotations

from zero_lab.analysis.diagnosis.finding import Finding
from zero_lab.analysis.diagnosis.torch_check import torch_check_lines
from zero_lab.analysis.diagnosis.run_data import RunData
from zero_lab.workload.meters.collective_record import Record, RecordedCall

ABORT_TEXT = "collective mismatch"  # gloo's own words when a rank receives more than it expects


def signature(call: RecordedCall) -> tuple:
    """What must agree across ranks for a call to meet its partners."""
    return call.op, call.payload_bytes, call.dtype


def first_difference(records: dict[int, Record]) -> tuple[int, dict[int, RecordedCall | None]] | None:
    """Phases 1-2: (call number, each rank's call there or None) at the first disagreement, or None."""
    if len(records) < 2:
        return None
    by_seq = {rank: {call.seq: call for call in record.calls} for rank, record in records.items()}
    first = max(min(calls, default=0) for calls in by_seq.values())
    last = max(record.issued for record in records.values())
    for seq in range(first, last):
        calls = {rank: calls.get(seq) for rank, calls in by_seq.items()}
        present = {signature(call) for call in calls.values() if call is not None}
        if len(present) > 1 or None in calls.values():
            return seq, calls
    return None


def only_missing(calls: dict[int, RecordedCall | None]) -> bool:
    """Every rank that reached the call issued the same one; the others issued none (they stopped)."""
    return len({signature(call) for call in calls.values() if call is not None}) <= 1


def described(call: RecordedCall | None) -> str:
    if call is None:
        return "no such call: it went on without the others, or stopped before"
    waiting = "returned" if call.returned else "never returned"
    return f"{call.op} of {call.payload_bytes} bytes ({call.dtype} {call.shape}) in {call.where() or 'start-up'}; {waiting}"


def likely_cause(calls: dict[int, RecordedCall | None]) -> str:
    """Phase 3."""
    present = [call for call in calls.values() if call is not None]
    between = [call for call in present if call.call in ("between steps", "harness")]
    if between and len(between) < len(calls):
        return ("some ranks did work between steps that the others did not (a rank-0-only save, evaluation "
                "or logging that calls a collective), so their collectives no longer line up")
    units = sorted({call.label for call in present if call.label.startswith(("unit ", "prefetch "))})
    if len(units) > 1 or (units and len(present) < len(calls)):
        return (f"the ranks gathered different stage-3 units at the same call ({'; '.join(units)}): a module "
                "that some ranks ran and the others skipped (at stage 3 every rank gathers a module's "
                "parameters together, so every rank must run the same modules)")
    places = sorted({call.where() for call in present})
    return ("the ranks called different collectives at the same point of the step "
            f"({'; '.join(places)}): code that runs on some ranks only, such as a module one rank skipped "
            "(at stage 3 every module's parameters are gathered by all ranks together)")


def collective_mismatch(run: RunData) -> list[Finding]:
    """The finding for a run that did not end well and whose records part (none otherwise)."""
    if run.summary.get("status") == "ok":
        return []
    found = first_difference(run.records)
    if found is None:
        return []
    seq, calls = found
    if only_missing(calls) and not run.ranks_saying(ABORT_TEXT) and (
            run.killing_signal() is not None or run.summary.get("failure") == "out_of_memory"
            or run.summary.get("status") in ("stalled", "unfinished")):
        # a rank killed from outside, out of memory, stopped (a stall) or left when its launcher was killed
        # issued nothing more: no rank called another collective (`rank-killed`, `out-of-memory`, `run-failed`)
        return []
    evidence = [run.ending(), f"the ranks agree on their first {seq} collectives; call {seq} differs:"]
    evidence += [f"rank {rank}: {described(call)}" for rank, call in sorted(calls.items())]
    evidence += torch_check_lines(run.stderr_of())
    said = run.ranks_saying(ABORT_TEXT)
    if said:
        evidence.append(f"rank {', '.join(map(str, said))} stderr: \"Is there a distributed collective mismatch in "
                        "your code?\" (gloo)")
    return [Finding(
        "collective-mismatch", f"{run.label}: the ranks' collectives part at call {seq}", evidence,
        likely_cause(calls),
        "Make every rank issue the same collectives: run a module on every rank, on a dummy input where a rank "
        "has no data for it (or keep its parameters out of stage 3's partitioning), and call saves and "
        "evaluations that use collectives on every rank. The records are logs/collectives-rank<N>.bin",
        runs=[run.name],
        figures={"call": seq, "ranks": {str(rank): None if call is None else
                                        {"op": call.op, "payload_bytes": call.payload_bytes, "dtype": call.dtype,
                                         "shape": call.shape, "step": call.step, "call": call.call,
                                         "label": call.label, "returned": call.returned}
                                        for rank, call in sorted(calls.items())}})]
