"""Calls and bytes per collective type, counted by wrapping `torch.distributed` from outside.

Both engines end in `torch.distributed`, so wrapping its collectives measures nano and official
DeepSpeed the same way. Install the meter before either engine's `init_distributed`: DeepSpeed
keeps references to `all_gather_into_tensor` and `reduce_scatter_tensor` from then on.

Byte convention (nano's own `engine.comm_stats()` uses the same one):
- all_reduce, reduce, broadcast: the bytes of the tensor;
- reduce_scatter, reduce_scatter_tensor (or _single), all_to_all(_single): the total bytes of
  the input;
- all_gather, all_gather_into_tensor (or _single): the total bytes of the output;
- the coalesced variants: the sum over their tensors, by the same rule.
Each call also counts its wire bytes: what one rank sends for that payload by NCCL-tests'
bus-bytes convention, for the size of the group it ran on (`wire_bytes.py`), and splits them into
intra-node and inter-node bytes: what this rank sends to the group's ranks on its own node and on
other nodes, nodes being `ranks_per_node` consecutive global ranks (`wire_bytes.wire_split`; no
`ranks_per_node`: one node, everything intra-node).
A call that emulates another collective counts under the collective it implements: nano's
reduce-scatter on gloo is an `all_to_all_single` of the bucket's shares (each rank then adds up
its own share's parts), named `reduce_scatter` by nano while it runs
(`zero_lab.nano.collectives.EMULATED_COLLECTIVE`), so it counts as `reduce_scatter`, payload the
whole bucket, wire bytes a reduce-scatter's.
A collective called from inside another one (torch 2.13's `all_gather_into_tensor` calls
`all_gather_single`) counts once, under the name the engine called; the private
`_all_gather_base` and `_reduce_scatter_base` are not wrapped, so they count as the `_single`
collectives they call.
With a `collective_record.CollectiveRecord` attached (`record_to`), every call is also written to
the rank's flight record as it starts and when it returns: the counted ones, the harness's own
(paused: not counted) and barriers (recorded, never counted), each with where the rank was: the
step and engine call of the `StepPhase` the harness or client keeps, and the label nano gives
(`zero_lab.nano.collectives.COLLECTIVE_LABEL`: its phase, unit or bucket).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Iterable
from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from zero_lab.nano.collectives import COLLECTIVE_LABEL, EMULATED_COLLECTIVE
from zero_lab.workload.meters.collective_record import NOT_IN_A_STEP, CollectiveRecord
from zero_lab.workload.step_phase import StepPhase
from zero_lab.workload.meters.wire_bytes import ranks_on_node, wire_split


def _nbytes(tensors) -> int:
    if isinstance(tensors, torch.Tensor):
        return tensors.numel() * tensors.element_size()
    if isinstance(tensors, Iterable):
        return sum(_nbytes(tensor) for tensor in tensors)
    return 0


# For each collective: the argument whose bytes it moves, by the convention above.
MEASURED_ARGUMENT = {
    "all_reduce": "tensor",
    "reduce": "tensor",
    "broadcast": "tensor",
    "reduce_scatter": "input_list",
    "reduce_scatter_tensor": "input",
    "reduce_scatter_single": "input",  # torch >= 2.13's name for reduce_scatter_tensor
    "all_gather": "tensor_list",
    "all_gather_into_tensor": "output_tensor",
    "all_gather_single": "output_tensor",  # torch >= 2.13's name for all_gather_into_tensor
    "all_to_all_single": "input",
    "all_to_all": "input_tensor_list",
    "all_reduce_coalesced": "tensors",
    "all_gather_coalesced": "output_tensor_lists",
}
RECORDED_ONLY = ("barrier",)  # moves no tensor: in the flight record, never in the counts


def _described(tensors) -> tuple[str, str]:
    """(dtype, shape) of what a call moves, for the flight record: '4x1024'; a list of N tensors 'N*4x1024'."""
    if isinstance(tensors, torch.Tensor):
        return str(tensors.dtype).removeprefix("torch."), "x".join(str(size) for size in tensors.shape)
    if isinstance(tensors, (list, tuple)) and tensors:
        dtype, shape = _described(tensors[0])
        return dtype, f"{len(tensors)}*{shape}"
    return "", ""


@dataclass
class OpCount:
    calls: int = 0
    bytes: int = 0
    wire_bytes: int = 0
    wire_intra_bytes: int = 0  # of wire_bytes: sent to ranks on this rank's node
    wire_inter_bytes: int = 0  # of wire_bytes: sent to ranks on other nodes

    def add(self, other: "OpCount", sign: int = 1) -> None:
        self.calls += sign * other.calls
        self.bytes += sign * other.bytes
        self.wire_bytes += sign * other.wire_bytes
        self.wire_intra_bytes += sign * other.wire_intra_bytes
        self.wire_inter_bytes += sign * other.wire_inter_bytes

    def copy(self) -> "OpCount":
        return OpCount(self.calls, self.bytes, self.wire_bytes, self.wire_intra_bytes, self.wire_inter_bytes)


class CommMeter:
    """Counts every collective of `MEASURED_ARGUMENT` issued while installed and not paused;
    `ranks_per_node` groups the ranks into (simulated) nodes for the intra/inter split."""

    def __init__(self, ranks_per_node: int | None = None):
        self.ranks_per_node = ranks_per_node
        self.counts: dict[str, OpCount] = {}
        self._originals: dict[str, object] = {}
        self._depth = 0  # > 0 while inside a wrapped collective
        self._paused = 0  # > 0 while the harness's own collectives run
        self._group_ranks: dict[object, list[int]] = {}
        self.trace: list[tuple[str, int, int]] | None = None  # a list: every call in order, (label, payload, wire)
        self.recorder: CollectiveRecord | None = None
        self.phase: StepPhase | None = None
        self.timeline = None  # a `timeline.Timeline` (`--trace`): every counted call is also a span

    def record_to(self, recorder: CollectiveRecord, phase: StepPhase) -> "CommMeter":
        """Write every call to `recorder` too, with `phase`'s step and engine call."""
        self.recorder, self.phase = recorder, phase
        return self

    def install(self) -> "CommMeter":
        for name, argument in [*MEASURED_ARGUMENT.items(), *((name, None) for name in RECORDED_ONLY)]:
            original = getattr(c10d, name, None)
            if original is None:
                continue
            self._originals[name] = original
            wrapper = self._wrap(name, original, argument)
            setattr(c10d, name, wrapper)  # what torch's own helpers call
            setattr(dist, name, wrapper)  # what engines call
        return self

    def uninstall(self) -> None:
        for name, original in self._originals.items():
            setattr(c10d, name, original)
            setattr(dist, name, original)
        self._originals.clear()

    def _wrap(self, name: str, original, argument: str | None):
        """`original` counted (argument: what it moves; None: recorded only) and recorded."""
        signature = inspect.signature(original)

        @functools.wraps(original)
        def counted(*args, **kwargs):
            if self._depth:  # called by another wrapped collective: that one counts
                return original(*args, **kwargs)
            bound = signature.bind(*args, **kwargs)
            label = EMULATED_COLLECTIVE.get() or name
            moved = bound.arguments[argument] if argument else None
            payload = _nbytes(moved)
            group_ranks = self._ranks_of(bound.arguments.get("group"))
            on_my_node = (ranks_on_node(group_ranks, c10d.get_rank(), self.ranks_per_node)
                          if self.ranks_per_node else len(group_ranks))
            intra, inter = wire_split(label, payload, len(group_ranks), on_my_node) if argument else (0, 0)
            if argument and not self._paused:
                self.record(label, payload, intra, inter)
            seq = self._start_entry(label, moved, payload, intra + inter, len(group_ranks)) if self.recorder else None
            span = (self.timeline.collective_started(label, payload, intra + inter, *_described(moved), len(group_ranks))
                    if self.timeline is not None and argument and not self._paused else None)
            self._depth += 1
            result = None
            try:
                result = original(*args, **kwargs)
                return result
            finally:
                self._depth -= 1
                if seq is not None:
                    self.recorder.returned(seq)
                if span is not None:
                    self.timeline.collective_returned(span, result)

        return counted

    def _start_entry(self, op: str, moved, payload: int, wire: int, group_size: int) -> int:
        """The flight record's entry of a call starting now (where: the phase's step and engine call)."""
        dtype, shape = _described(moved)
        step = self.phase.step if self.phase is not None and self.phase.step is not None else NOT_IN_A_STEP
        call = "harness" if self._paused else self.phase.current.value if self.phase is not None else ""
        return self.recorder.started(op, payload, wire, dtype, shape, group_size, step, call,
                                     COLLECTIVE_LABEL.get() or "")

    def _ranks_of(self, group) -> list[int]:
        """The global ranks of a process group (None: the world), looked up once per group."""
        if group not in self._group_ranks:
            self._group_ranks[group] = (list(range(c10d.get_world_size())) if group is None
                                        else c10d.get_process_group_ranks(group))
        return self._group_ranks[group]

    def record(self, label: str, payload: int, intra: int, inter: int = 0) -> None:
        """One call: its payload, and its wire bytes to ranks on this node (intra) and on others (inter)."""
        self.counts.setdefault(label, OpCount()).add(OpCount(1, payload, intra + inter, intra, inter))
        if self.trace is not None:
            self.trace.append((label, payload, intra + inter))

    def reset(self) -> None:
        self.counts = {}

    def snapshot(self) -> dict[str, OpCount]:
        return {name: count.copy() for name, count in self.counts.items()}

    @contextmanager
    def paused(self):
        """Collectives issued inside (the harness's own bookkeeping) are not counted (but recorded)."""
        self._paused += 1
        try:
            yield
        finally:
            self._paused -= 1


def difference(after: dict[str, OpCount], before: dict[str, OpCount]) -> dict[str, OpCount]:
    """Counts issued between two snapshots, for the ops that moved anything."""
    delta = {}
    for name, count in after.items():
        earlier = before.get(name, OpCount())
        if count.calls != earlier.calls:
            delta[name] = count.copy()
            delta[name].add(earlier, sign=-1)
    return delta


def accumulate(totals: dict[str, OpCount], counts: dict[str, OpCount]) -> None:
    """Add counts (a `difference`) into totals, op by op."""
    for name, count in counts.items():
        totals.setdefault(name, OpCount()).add(count)
