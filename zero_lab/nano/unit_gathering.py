"""Stage 3's gathering of units around their uses: module hooks, holds, and the fetch rules.

Which unit is gathered or freed when is decided by `fetch_policy` (official DeepSpeed's rules over
the trace recorded at the previous micro-step), which `initialize` hands over; this module is the
mechanism that applies them (without them each use gathers its units and frees them after it).
As official, every module is traced (containers and modules without parameters too, none inside
a leaf module); a module whose own parameters (a leaf module's: its subtree's) are a sharded unit
fetches it, with the units of its external parameters (`external_parameters`: a parameter it reads
but does not own, registered when its first read finds it not whole). For each use of a traced
module, one micro-step runs in phases, each in the hook named for its moment:
    1. pre_forward: note the use in the trace being recorded; gather the module's units (one
       all-gather into full buffers allocated for this use; the parameters are views of them);
       start gathering the units the prefetch rule reaches, all of them in one call
       (`coalesced_gather`: one call per fetch and per prefetch, as official). Until its
       post_forward, a parameter the forward reads whose unit is not whole is gathered then and
       held by this use (`_on_read`, official's `ZeROOrderedDict`). The model's own pre_forward
       gathers the root unit (a parameter two modules own, as a tied embedding and head, or the
       model's own) and holds it to the end of the backward.
    2. post_forward: free each unit the use holds unless another use still holds it or the release
       rule keeps it (reached by the prefetch, or reused within `stage3_max_reuse_distance`).
    3. pre_backward (a hook on the gradients of the use's outputs): note the use in the trace (the
       backward's order is recorded as it happens), gather its units again if they were freed, and
       prefetch along the backward's order.
    4. (stage 2's post-accumulate-grad hooks reduce-scatter the gradients into partitions.)
    5. post_backward (an identity autograd function on the module's inputs, whose backward runs
       once their gradients exist): free the units unless the release rule keeps them.
A use holds a unit and releases it once, so a module called twice, the recomputation of
activation checkpointing inside backward (gathered again outside the trace and held until the
module's post_backward, as official's `ds_recompute_parameters`) and a prefetch compose: the
buffer is freed when the last holder lets go. Without autograd (`torch.no_grad()`, eval) phases
3-5 do not happen and the forward releases all it gathered, the root included. `release_all()`
(after each backward and before each optimizer step) frees whatever is still gathered (a module
whose inputs need no gradient, as the embedding, has no phase 5), and the micro-step's trace
becomes the one the next micro-step follows (each use with the external parameters registered by
then, as official builds its parameter trace from its module trace).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch.utils._pytree import tree_flatten, tree_unflatten

from zero_lab.nano.coalesced_gather import start_gathers
from zero_lab.nano.collectives import Collectives, labelled
from zero_lab.nano.external_parameters import external_parameters, register_external_parameter, unwatch, watch
from zero_lab.nano.fetch_trace import TracedUse
from zero_lab.nano.sharded_flat_buffer import BufferState, GatheredElements, ShardedFlatBuffer
from zero_lab.nano.units import Unit


@dataclass
class GatheredUnit:
    """One sharded unit, its buffers (one per parameter group) and who holds it now."""

    unit: Unit
    buffers: list[ShardedFlatBuffer]
    holds: int = 0
    prefetched: bool = False  # gathered ahead of its use; the use takes the prefetch's hold
    kept: bool = False  # not freed at its last release: the release rule keeps it
    numel: int = field(init=False)

    def __post_init__(self):
        self.numel = sum(buffer.layout.padded_numel for buffer in self.buffers)

    @property
    def gathered(self) -> bool:
        return any(buffer.state != BufferState.SHARDED for buffer in self.buffers)


@dataclass
class TracedModule:
    """A module the trace notes: the unit it fetches (None: a container, a module whose parameters
    are persistent or the root's) and the elements official's reuse walk counts."""

    index: int
    module: torch.nn.Module
    block: GatheredUnit | None
    numel: int
    owns_root: bool = False  # some of its own parameters are the root unit's
    backward_holds: list[list[GatheredUnit]] = field(default_factory=list)  # the units its gradients' hook holds
    recompute_holds: list[list[GatheredUnit]] = field(default_factory=list)  # those a recomputation holds
    known: tuple = (None, None, [])  # (the ids of its external parameters, use, units) as last computed

    def use(self, root: GatheredUnit | None, owner: dict[int, GatheredUnit]) -> tuple[TracedUse, list[GatheredUnit]]:
        """The use as the trace notes it and what it holds (its unit, then its external parameters', which count
        as its own: official's `iter_params`; a new list), cached: a module is used hundreds of times a step."""
        external = external_parameters(self.module)
        if self.known[0] != tuple(map(id, external)):
            unit = self.block if self.block is not None else root if self.owns_root else None
            units = {id(entry): entry for entry in [self.block] + [owner.get(id(parameter)) for parameter in external]
                     if entry is not None}
            use = TracedUse(self.index, unit.unit.name if unit is not None else None,
                            self.numel + sum(parameter.numel() for parameter in external),
                            tuple(dict.fromkeys(entry.unit.name for entry in list(units.values())[self.block is not None:])))
            self.known = (tuple(map(id, external)), use, list(units.values()))
        return self.known[1], list(self.known[2])


class _ReleaseAfterBackward(torch.autograd.Function):
    """Identity on a unit's inputs; its backward runs once the inputs' gradients exist (phase 5)."""

    @staticmethod
    def forward(ctx, release, *tensors):
        ctx.release = release
        return tensors

    @staticmethod
    def backward(ctx, *gradients):
        ctx.release()
        return (None, *gradients)


def traced_modules(model: torch.nn.Module, entries: list[GatheredUnit]) -> list[TracedModule]:
    """Every module official traces, in the model's order: all but those inside a module fetched
    whole (a leaf module); each with the unit it fetches and the elements it touches (its own
    parameters, or a leaf module's subtree)."""
    fetched = {id(entry.unit.module): entry for entry in entries if entry.unit.module is not model}
    root = next((entry for entry in entries if entry.unit.module is model), None)
    root_parameters = set(root.unit.parameters) if root is not None else set()
    inside = {id(inner) for entry in fetched.values() if entry.unit.whole_module
              for inner in entry.unit.module.modules() if inner is not entry.unit.module}
    traced = []
    for module in model.modules():
        if id(module) in inside:
            continue
        entry = fetched.get(id(module))
        touched = list(module.parameters(recurse=entry is not None and entry.unit.whole_module))
        traced.append(TracedModule(len(traced), module, entry, sum(parameter.numel() for parameter in touched),
                                   owns_root=any(parameter in root_parameters for parameter in touched)))
    return traced


class UnitGathering:
    """Holds, gathers and frees the sharded units of one model (see the module docstring)."""

    def __init__(self, model: torch.nn.Module, entries: list[GatheredUnit], collectives: Collectives,
                 rules=None):
        self.model = model
        self.entries = entries
        self.collectives = collectives
        self.rules = rules  # fetch_policy.FetchRules, or None: no prefetch, each unit freed after its use
        self.by_name = {entry.unit.name: entry for entry in entries}
        self.live = GatheredElements()  # the elements of every unit now whole or gathering
        for buffer in (buffer for entry in entries for buffer in entry.buffers):
            buffer.count_in(self.live)
        self.root = next((entry for entry in entries if entry.unit.module is model), None)
        self.trace: list[TracedUse] = []  # the forward's uses at the previous micro-step
        self.backward_trace: list[TracedUse] | None = None  # its backward's (None: it had none)
        self.recording: list[TracedUse] = []  # this micro-step's uses, the forward's then the backward's
        self.forward_uses = 0  # how many of them the forward made
        self.schedule = None  # the rules over the last trace (`FetchRules.schedule`), None: none apply
        self.in_backward = False  # the forward is done; forwards now are recomputations
        self.owner = {id(parameter): entry for entry in entries for parameter in entry.unit.parameters}
        self.in_forward: list[tuple[TracedModule, list[GatheredUnit]]] = []  # forwards running, innermost last
        self.handles = []
        self.traced = traced_modules(model, entries)
        for traced in self.traced:
            self.handles += [traced.module.register_forward_pre_hook(self._pre_forward(traced), with_kwargs=True),
                             traced.module.register_forward_hook(self._post_forward(traced))]
        self._guard_modules()
        watch(model, self._on_read)

    # ----- holding ---------------------------------------------------------------------------
    def acquire(self, entries: list[GatheredUnit]) -> None:
        """Hold each of `entries` for one use and make sure they are whole."""
        for entry in entries:
            if entry.prefetched:
                entry.prefetched = False  # this use takes over the prefetch's hold
            else:
                entry.holds += 1
            entry.kept = False
        if any(buffer.state == BufferState.SHARDED for entry in entries for buffer in entry.buffers):
            with labelled("unit " + ",".join(entry.unit.name for entry in entries)):
                start_gathers([buffer for entry in entries for buffer in entry.buffers], self.collectives)  # one call (per dtype)
        for entry in entries:
            for buffer in entry.buffers:
                buffer.wait()

    def release(self, entry: GatheredUnit, keep: bool = False) -> None:
        entry.holds = max(0, entry.holds - 1)
        entry.kept = entry.kept or keep
        if entry.holds == 0 and not entry.prefetched and not entry.kept:
            for buffer in entry.buffers:
                buffer.reshard()

    def _release_use(self, units: list[GatheredUnit]) -> None:
        """A use lets go of what it held, each unit under the release rule."""
        for entry in units:
            self.release(entry, keep=self._keep(entry))

    def release_all(self) -> None:
        """Nothing stays gathered: the end of a backward, or before the optimizer changes partitions."""
        for entry in self.entries:
            entry.holds, entry.prefetched, entry.kept = 0, False, False
            for buffer in entry.buffers:
                buffer.reshard()
        for traced in self.traced:
            traced.backward_holds.clear()
            traced.recompute_holds.clear()
        self.in_backward, self.schedule, self.in_forward = False, None, []
        if self.recording:
            recorded = [self.traced[use.module].use(self.root, self.owner)[0] for use in self.recording]
            forward_uses = self.forward_uses or len(recorded)
            self.trace, self.backward_trace = recorded[:forward_uses], recorded[forward_uses:] or None
            self.recording, self.forward_uses = [], 0

    # ----- the fetch rules (fetch_policy) ----------------------------------------------------
    def _prefetch(self, position: int | None) -> None:
        """Rule 2 at the use at `position`: start gathering what the schedule reaches."""
        if self.schedule is None or position is None:
            return
        started = [self.by_name[name] for name in
                   self.schedule.prefetch(position, lambda unit: self.by_name[unit].gathered, self.live.numel)]
        for entry in started:
            entry.prefetched = True
        if started:
            with labelled("prefetch " + ",".join(entry.unit.name for entry in started)):
                start_gathers([buffer for entry in started for buffer in entry.buffers], self.collectives,
                              asynchronous=True)  # one call (per dtype) for the whole prefetch

    def _keep(self, entry: GatheredUnit) -> bool:
        """Rule 3 at this moment: official counts the uses begun so far."""
        return self.schedule is not None and self.schedule.keep(entry.unit.name, len(self.recording))

    def _record(self, traced: TracedModule) -> int:
        """Note a use in the trace being recorded; its position (the schedule is dropped if the use
        is not the recorded one: no rules for the rest of this micro-step)."""
        use, position = traced.use(self.root, self.owner)[0], len(self.recording)
        self.recording.append(use)
        if self.schedule is not None and not self.schedule.follows_trace(position, use):
            self.schedule = None
        return position

    # ----- the hooks (phases 1-5), named for the moment they run ------------------------------
    def _pre_forward(self, traced: TracedModule):
        def pre_forward(module, args, kwargs):
            if traced.module is self.model:
                self._start_micro_step()
            units = traced.use(self.root, self.owner)[1]
            # a recomputation inside backward is outside the trace; post_forward keeps its hold to post_backward
            position = None if self.in_backward else self._record(traced)
            self.acquire(units)  # Phase 1
            self.in_forward.append((traced, units))  # a parameter read from now on, not whole, joins `units`
            self._prefetch(position)
            if not units or not torch.is_grad_enabled():
                return None
            leaves, spec = tree_flatten((args, kwargs))
            needing = [index for index, leaf in enumerate(leaves) if isinstance(leaf, torch.Tensor) and leaf.requires_grad]
            if not needing:
                return None
            wrapped = _ReleaseAfterBackward.apply(lambda: self._post_backward(traced), *[leaves[i] for i in needing])
            for index, tensor in zip(needing, wrapped):  # Phase 5, once these inputs have gradients
                leaves[index] = tensor
            return tree_unflatten(leaves, spec)
        return pre_forward

    def _post_forward(self, traced: TracedModule):
        def post_forward(module, args, output):
            units = self._leave(traced)
            if self.in_backward:  # a recomputation: its units stay held for the backward that follows
                traced.recompute_holds.append(units)
                return
            if torch.is_grad_enabled():
                outputs = [leaf for leaf in tree_flatten(output)[0]
                           if isinstance(leaf, torch.Tensor) and leaf.requires_grad]
                if len(outputs) == 1:  # the same moment as the hook below, at a third of its cost
                    outputs[0].register_hook(lambda _: self._pre_backward(traced))
                elif outputs:
                    torch.autograd.graph.register_multi_grad_hook(outputs, lambda _: self._pre_backward(traced),
                                                                  mode="any")
            self._release_use(units)  # Phase 2
            if traced.module is self.model:
                self.forward_uses = len(self.recording)
                if torch.is_grad_enabled():
                    self.in_backward = True
                else:  # no backward follows: nothing may stay gathered
                    self.release_all()
        return post_forward

    def _pre_backward(self, traced: TracedModule) -> None:
        """Phase 3: noted in the trace (official records the backward's order as it happens)."""
        position = self._record(traced)
        units = traced.use(self.root, self.owner)[1]
        self.acquire(units)
        traced.backward_holds.append(units)
        self._prefetch(position)

    def _post_backward(self, traced: TracedModule) -> None:
        """Phase 5: the hold of its gradients' hook, and those of any recomputation, let go."""
        if traced.backward_holds:
            self._release_use(traced.backward_holds.pop())
        while traced.recompute_holds:
            self._release_use(traced.recompute_holds.pop())

    def _leave(self, traced: TracedModule) -> list[GatheredUnit]:
        """`traced`'s forward ends: what its use holds, off the stack of forwards running."""
        for position in range(len(self.in_forward) - 1, -1, -1):
            if self.in_forward[position][0] is traced:
                return self.in_forward.pop(position)[1]
        return []

    def _on_read(self, parameter: torch.nn.Parameter) -> None:
        """A parameter read by name (`external_parameters` Phase 2): inside a forward, one whose unit
        is not whole becomes external to the innermost module running and is gathered for its use;
        one whose gather is in flight (prefetched) is waited for, as official reads it unregistered."""
        entry = self.owner.get(id(parameter))
        if entry is None or not self.in_forward or all(buffer.state == BufferState.UNSHARDED
                                                       for buffer in entry.buffers):
            return
        if entry.gathered:
            for buffer in entry.buffers:
                buffer.wait()
            return
        traced, units = self.in_forward[-1]
        register_external_parameter(traced.module, parameter)
        self.schedule = None  # the recorded trace did not have this use: no rules for the rest of the micro-step
        self.acquire([entry])
        units.append(entry)

    def _start_micro_step(self) -> None:
        """The model's forward begins: a new recording, the last one's schedule, the root held."""
        self.recording, self.in_backward, self.in_forward = [], False, []
        self.schedule = self.rules.schedule(self.trace, {entry.unit.name: entry.numel for entry in self.entries},
                                            self.backward_trace) if self.trace and self.rules is not None else None
        if self.root is not None and self.root.holds == 0:
            self.acquire([self.root])

    # ----- a clear error instead of reading freed memory ---------------------------------------
    def _guard_modules(self) -> None:
        """Every module with sharded parameters of its own checks, before its forward, that they
        are whole: outside the model's forward (where no read gathers, as in official DeepSpeed) a
        module of a leaf module called by itself raises here rather than reading a freed buffer."""
        for name, module in self.model.named_modules():
            own = [(parameter_name, self.owner[id(parameter)]) for parameter_name, parameter in
                   module.named_parameters(recurse=False) if id(parameter) in self.owner]
            if own:
                self.handles.append(module.register_forward_pre_hook(self._guard(name, own)))

    def _guard(self, module_name: str, own: list):
        def hook(module, args):
            if self.in_forward:  # inside the model's forward a read gathers (`_on_read`)
                return
            for parameter_name, entry in own:
                if any(buffer.state == BufferState.SHARDED for buffer in entry.buffers):
                    raise RuntimeError(
                        f"stage 3: {module_name or 'the model'}.{parameter_name} is used while its unit "
                        f"'{entry.unit.name}' is not gathered (a parameter used outside its unit); call it inside "
                        "the model's forward, or wrap the use in zero_lab.nano.zero.GatheredParameters")
        return hook

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles = []
        unwatch(self.model)
        self.release_all()
