"""When each collective of a traced step was issued, relative to the computation it could overlap.

A step's time is its computation plus the communication that does not overlap it. A collective
can only overlap what runs while it is in flight: the forward, or autograd's computation of the
gradients inside the backward (the timeline's `autograd` span: `workload.tracing.autograd_moments`).
What an engine does in its backward after autograd has returned (official's and nano's reduction
at stages 0 and 1), and its optimizer step, have no computation left to overlap. So each collective
falls in one of four moments:
    forward        issued during the forward (stage 3's gathers, the prefetch among them);
    autograd       issued while autograd computes the gradients (a bucket reduced from its hook);
    after autograd issued in the backward once autograd has returned: the rank waits for it;
    step           issued in the optimizer step (the all-gather of the updated parameters).
Whether a call issued during the forward or autograd really overlaps depends on when the engine
waits for it (`overlap_comm`), which the timeline draws but these counts do not claim.

Phase 1: `issued(trace, step)` takes one rank's traced step apart: each collective, in the order
         issued, with its moment, family and wire bytes.
Phase 2: `moments(calls)` adds them up per moment: calls, wire bytes, the families.
The order and the bytes are the engine's and the same on every machine (a CPU's timeline is
honest about order, not about a GPU's speed).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from zero_lab.analysis.runs.traces import family, spans, step_windows

MOMENTS = ("forward", "autograd", "after autograd", "step")


@dataclass(frozen=True)
class Issued:
    """One collective of the step, as the timeline recorded it."""

    op: str  # its family: all_gather, reduce_scatter, all_reduce...
    moment: str  # one of MOMENTS
    wire_bytes: int


def windows(trace: dict, step: int) -> dict[str, list[tuple[float, float]]]:
    """The step's (start, end) windows of each engine call and of autograd, in us."""
    begin, end = step_windows(trace)[step]
    found: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for span in spans(trace, "phase") + spans(trace, "autograd"):
        if begin <= span["ts"] <= end:
            name = {"optimizer step": "step"}.get(span["name"], span["name"])
            found[name].append((span["ts"], span["ts"] + span["dur"]))
    return found


def moment_at(time: float, found: dict[str, list[tuple[float, float]]]) -> str | None:
    """The moment a call issued at `time` belongs to (None: between the engine's calls)."""
    within = lambda name: any(start <= time <= end for start, end in found.get(name, []))  # noqa: E731
    if within("forward"):
        return "forward"
    if within("autograd"):
        return "autograd"
    if within("backward"):
        return "after autograd"
    return "step" if within("step") else None


def issued(trace: dict, step: int) -> list[Issued]:
    """Phase 1 for one rank's traced step, in the order the calls were issued."""
    found = windows(trace, step)
    calls = []
    for span in sorted(spans(trace, "collective"), key=lambda span: span["ts"]):
        moment = moment_at(span["ts"], found) if span["args"].get("step") == step else None
        if moment is not None:
            calls.append(Issued(family(span["name"]), moment, span["args"]["wire_bytes"]))
    return calls


def moments(calls: list[Issued]) -> dict[str, dict]:
    """Phase 2: per moment (every one present), {"calls", "wire_bytes", "ops": the families, in order}."""
    table = {moment: {"calls": 0, "wire_bytes": 0, "ops": []} for moment in MOMENTS}
    for call in calls:
        row = table[call.moment]
        row["calls"] += 1
        row["wire_bytes"] += call.wire_bytes
        if call.op not in row["ops"]:
            row["ops"].append(call.op)
    return table
