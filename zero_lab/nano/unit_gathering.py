"""Stage 3's gathering of units around their uses: module hooks, holds, prefetch, reuse.

For each sharded unit (a block, or the root) one micro-step runs in phases:
    1. forward pre-hook: gather the unit (all-gather into a full buffer allocated for this use;
       the parameters are views of it); with `overlap_comm`, start gathering the next units of
       the forward order recorded at the previous micro-step (prefetch).
    2. forward post-hook: release the unit: its full buffer is freed unless another use still
       holds it, or `stage3_max_reuse_distance` says it is used again soon. The root unit (the
       model's own parameters: embeddings, final norm, head) is held from the model's forward
       to the end of its backward instead: the head's backward comes first, the embedding's
       last, so freeing it between them would only gather it twice.
    3. before the unit's backward (a hook on the gradients of its outputs): gather it again;
       with `overlap_comm`, start gathering the units before it (the reverse order).
    4. (stage 2's post-accumulate-grad hooks reduce-scatter the gradients into partitions.)
    5. after the unit's backward (an identity autograd function on its inputs, whose backward
       runs once their gradients exist): release the unit.
A use holds a unit and releases it once, so a module called twice, the recomputation of
activation checkpointing inside backward, and a prefetch compose: the buffer is freed when the
last holder lets go. Without autograd (`torch.no_grad()`, eval) phases 3-5 do not happen and the
forward releases all it gathered, the root included. `release_all()` (after each backward and
before each optimizer step) frees whatever is still gathered.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch.utils._pytree import tree_flatten, tree_unflatten

from zero_lab.nano.collectives import Collectives
from zero_lab.nano.flat_buffer import BufferState, ShardedFlatBuffer
from zero_lab.nano.unit_policy import used_again_soon
from zero_lab.nano.units import Unit


@dataclass
class GatheredUnit:
    """One sharded unit, its buffers (one per parameter group) and who holds it now."""

    unit: Unit
    buffers: list[ShardedFlatBuffer]
    holds: int = 0
    prefetched: bool = False  # gathered ahead of its use; the use takes the prefetch's hold
    kept: bool = False  # not freed at its last release: reused soon
    numel: int = field(init=False)

    def __post_init__(self):
        self.numel = sum(buffer.layout.padded_numel for buffer in self.buffers)

    @property
    def gathered(self) -> bool:
        return any(buffer.state != BufferState.SHARDED for buffer in self.buffers)


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


class UnitGathering:
    """Holds, gathers and frees the sharded units of one model (see the module docstring)."""

    def __init__(self, model: torch.nn.Module, entries: list[GatheredUnit], collectives: Collectives,
                 prefetch_numel: int, max_live_numel: int, max_reuse_distance: int):
        self.model = model
        self.entries = entries
        self.collectives = collectives
        self.prefetch_numel = prefetch_numel  # 0: no prefetch (overlap_comm false)
        self.max_live_numel = max_live_numel
        self.max_reuse_distance = max_reuse_distance
        self.trace: list[GatheredUnit] = []  # the forward order of the previous micro-step
        self.recording: list[GatheredUnit] = []
        self.backward_uses = 0
        self.handles = [model.register_forward_pre_hook(self._root_before_forward),
                        model.register_forward_hook(self._root_after_forward)]
        for entry in entries:
            if entry.unit.module is not model:
                self.handles += [entry.unit.module.register_forward_pre_hook(self._before_forward(entry),
                                                                              with_kwargs=True),
                                 entry.unit.module.register_forward_hook(self._after_forward(entry))]
        self._guard_modules()

    # ----- holding ---------------------------------------------------------------------------
    def acquire(self, entry: GatheredUnit) -> None:
        """Hold `entry` for one use and make sure it is whole."""
        if entry.prefetched:
            entry.prefetched = False  # this use takes over the prefetch's hold
        else:
            entry.holds += 1
        entry.kept = False
        for buffer in entry.buffers:
            buffer.unshard(self.collectives)
            buffer.wait()

    def release(self, entry: GatheredUnit, keep: bool = False) -> None:
        entry.holds = max(0, entry.holds - 1)
        entry.kept = entry.kept or keep
        if entry.holds == 0 and not entry.prefetched and not entry.kept:
            for buffer in entry.buffers:
                buffer.reshard()

    def release_all(self) -> None:
        """Nothing stays gathered: the end of a backward, or before the optimizer changes partitions."""
        for entry in self.entries:
            entry.holds, entry.prefetched, entry.kept = 0, False, False
            for buffer in entry.buffers:
                buffer.reshard()
        self.backward_uses = 0
        if self.recording:
            self.trace, self.recording = self.recording, []

    def live_numel(self) -> int:
        return sum(entry.numel for entry in self.entries if entry.gathered)

    # ----- prefetch and reuse ----------------------------------------------------------------
    def _prefetch(self, upcoming: list[GatheredUnit]) -> None:
        """Start gathering the next units of `upcoming` within the prefetch and live budgets."""
        budget = self.prefetch_numel
        for entry in upcoming:
            if entry.gathered or entry.holds:
                continue  # already whole: costs nothing
            if budget <= 0 or self.live_numel() + entry.numel > self.max_live_numel:
                break
            budget -= entry.numel
            entry.prefetched = True
            for buffer in entry.buffers:
                buffer.unshard(self.collectives, asynchronous=True)

    def _used_again_soon(self, entry: GatheredUnit, position: int, with_backward: bool) -> bool:
        """stage3_max_reuse_distance (`unit_policy.used_again_soon`) over the recorded order: the
        forward, then the backward in reverse."""
        order = self.trace + (self.trace[::-1] if with_backward else [])
        return used_again_soon(entry, order, position, lambda other: other.numel, self.max_reuse_distance)

    # ----- the hooks (phases 1-5) ------------------------------------------------------------
    def _before_forward(self, entry: GatheredUnit):
        def hook(module, args, kwargs):
            position = len(self.recording)
            self.recording.append(entry)
            self.acquire(entry)  # Phase 1
            if self.prefetch_numel and self.trace[position:position + 1] == [entry]:
                self._prefetch(self.trace[position + 1:])
            if not torch.is_grad_enabled():
                return None
            leaves, spec = tree_flatten((args, kwargs))
            needing = [index for index, leaf in enumerate(leaves) if isinstance(leaf, torch.Tensor) and leaf.requires_grad]
            if not needing:
                return None
            wrapped = _ReleaseAfterBackward.apply(lambda: self.release(entry), *[leaves[i] for i in needing])
            for index, tensor in zip(needing, wrapped):  # Phase 5, once these inputs have gradients
                leaves[index] = tensor
            return tree_unflatten(leaves, spec)
        return hook

    def _after_forward(self, entry: GatheredUnit):
        def hook(module, args, output):
            position = len(self.recording) - 1 - self.recording[::-1].index(entry)
            with_backward = torch.is_grad_enabled()
            if with_backward:
                outputs = [leaf for leaf in tree_flatten(output)[0]
                           if isinstance(leaf, torch.Tensor) and leaf.requires_grad]
                if outputs:
                    torch.autograd.graph.register_multi_grad_hook(outputs, lambda _: self._before_backward(entry),
                                                                  mode="any")
            self.release(entry, keep=self._used_again_soon(entry, position, with_backward))  # Phase 2
        return hook

    def _before_backward(self, entry: GatheredUnit) -> None:
        """Phase 3."""
        self.acquire(entry)
        self.backward_uses += 1
        if self.prefetch_numel:
            backward_order = self.trace[::-1]
            self._prefetch(backward_order[self.backward_uses:])

    def _root_before_forward(self, module, args):
        root = self._root()
        self.recording = []
        if root is not None and root.holds == 0:
            self.recording.append(root)
            self.acquire(root)

    def _root_after_forward(self, module, args, output):
        if not torch.is_grad_enabled():  # no backward follows: nothing may stay gathered
            self.release_all()

    def _root(self) -> GatheredUnit | None:
        return next((entry for entry in self.entries if entry.unit.module is self.model), None)

    # ----- a clear error instead of reading freed memory ---------------------------------------
    def _guard_modules(self) -> None:
        """Every module with sharded parameters of its own checks, before its forward, that they
        are whole: a parameter used outside its unit (a block's module called from elsewhere)
        raises here rather than reading a freed buffer."""
        owner = {parameter: entry for entry in self.entries for parameter in entry.unit.parameters}
        for name, module in self.model.named_modules():
            own = [(parameter_name, owner[parameter]) for parameter_name, parameter in
                   module.named_parameters(recurse=False) if parameter in owner]
            if own:
                self.handles.append(module.register_forward_pre_hook(self._guard(name, own)))

    @staticmethod
    def _guard(module_name: str, own: list):
        def hook(module, args):
            for parameter_name, entry in own:
                if any(buffer.state == BufferState.SHARDED for buffer in entry.buffers):
                    raise RuntimeError(
                        f"stage 3: {module_name or 'the model'}.{parameter_name} is used while its unit "
                        f"'{entry.unit.name}' is not gathered (a parameter used outside its unit); name the calling "
                        "module's class in zero_optimization.leaf_module, or wrap the use in "
                        "zero_lab.nano.zero.GatheredParameters")
        return hook

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles = []
        self.release_all()
