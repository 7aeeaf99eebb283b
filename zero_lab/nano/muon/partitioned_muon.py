"""Muon over ZeRO's partitions: whole matrices where Newton-Schulz needs them, partitions elsewhere.

Every other optimizer nano runs is element-wise, so a rank can update any cut of the flat buffer
from the same cut of the gradient. Muon's update of one element reads the whole matrix, so this
optimizer adds one phase to the shared step (`ZeroOptimizer.step`'s Phase 2b, `prepare_updates`).
Where the momentum lives is a policy `initialize` decides once, as official DeepSpeed keeps it at
the stage (`muon.memory`): stages 0-2 keep, per Muon flat buffer, the momentum of every matrix the
rank's partition touches, whole; stage 3 keeps the momentum's partition, as ZeRO keeps Adam's.

Phase 2b (whole matrices, after the gradients are reduced and unscaled, before the norm):
    1. gather:  each Muon buffer's fp32 gradient partitions are all-gathered into one whole
                gradient (one `all_gather_into_tensor` per buffer and step; none where a rank's
                partition is the whole buffer, at one rank or stage 0); a partitioned momentum
                is gathered whole the same way;
    2. update:  this rank runs `muon_update` on every matrix its partition touches: the matrices
                cut by a partition boundary are orthogonalised by both ranks that own a piece, as
                official DeepSpeed's owners both orthogonalise them; the new momentum is staged
                (kept aside until the step survives the norm), whole or its partition's slice;
    3. write:   its partition's piece of each update replaces the gradient partition, so the
                global norm and clipping then see updates, as official's do.
Phase 4 (`step`): the staged momentum becomes the state; a Muon master moves by
    master * (1 - lr * weight_decay) - lr * update; an AdamW master takes nano's AdamW (`adamw.py`).
"""

from __future__ import annotations

import torch

from zero_lab.nano.adamw import PartitionedAdam
from zero_lab.nano.collectives import labelled
from zero_lab.nano.muon.memory import momentum_numel, touched_matrices
from zero_lab.nano.muon.newton_schulz import muon_update


class PartitionedMuon(PartitionedAdam):
    """The optimizer `initialize` puts in place of Adam when the config's optimizer is Muon: the
    same masters and groups (`groups.split_groups`' halves), Muon for the halves with `use_muon`."""

    checkpoint_refusal = ("nano's checkpoint files do not hold Muon's momentum; train Muon without "
                          "save_checkpoint/load_checkpoint, or use AdamW")

    def __init__(self, zero_optimizer, decoupled_weight_decay: bool, partitioned_momentum: bool = False):
        self.partitioned_momentum = partitioned_momentum  # the policy: see the module docstring
        self.buffers = zero_optimizer.buffers
        self.collectives = zero_optimizer.collectives
        self.pending: dict[int, torch.Tensor] = {}  # master id -> momentum staged by this step's Phase 2b
        groups = zero_optimizer.partition_optimizer.param_groups  # the groups' own dicts, masters already in place
        for group in groups:
            group.setdefault("decoupled_weight_decay", decoupled_weight_decay)
        torch.optim.Optimizer.__init__(self, groups, {})
        self.master_of_buffer = list(zero_optimizer.master_partitions)

    def owned_matrices(self, index: int) -> list[int]:
        """Buffer `index`'s matrices (their positions in the buffer) that this rank's partition touches."""
        return touched_matrices(self.buffers[index].layout, self.collectives.rank)

    def _whole(self, index: int, partition: torch.Tensor) -> torch.Tensor:
        """Step 1: buffer `index`'s whole fp32 tensor (gradient or momentum) on this rank, from its partitions."""
        layout = self.buffers[index].layout
        if layout.partition_count == 1 or self.collectives.alone:
            return partition
        whole = torch.empty(layout.padded_numel, dtype=partition.dtype, device=partition.device)
        with labelled("muon_gather"):
            self.collectives.all_gather_into_tensor(whole, partition)
        return whole

    @torch.no_grad()
    def prepare_updates(self, partitions: list[torch.Tensor]) -> None:
        """Phase 2b: each Muon buffer's gradient partition becomes its piece of the Muon updates."""
        self.pending.clear()
        for index, buffer in enumerate(self.buffers):
            group = self.param_groups[buffer.group_index]
            if not group["use_muon"]:
                continue
            master, owned, layout = self.master_of_buffer[index], self.owned_matrices(index), buffer.layout
            whole = self._whole(index, partitions[index])
            state = self.state[master]
            if "momentum_buffer" not in state:
                state["momentum_buffer"] = torch.zeros(
                    momentum_numel(layout, self.collectives.rank, self.partitioned_momentum), dtype=torch.float32,
                    device=master.device)
            if self.partitioned_momentum:  # the whole momentum, indexed as the buffer is
                gathered = self._whole(index, state["momentum_buffer"])
                staged = gathered.clone() if gathered is state["momentum_buffer"] else gathered
                momentum_offsets = [layout.offsets[position] for position in owned]
            else:  # the touched matrices' momentum, end to end
                staged = state["momentum_buffer"].clone()
                momentum_offsets = [sum(layout.parameter_numels[p] for p in owned[:k]) for k in range(len(owned))]
            for position, momentum_offset in zip(owned, momentum_offsets):  # step 2, then step 3
                offset, numel = layout.offsets[position], layout.parameter_numels[position]
                shape = buffer.parameters[position].shape
                gradient = whole[offset:offset + numel].view(shape)  # the Nesterov blend is written into it
                momentum = staged[momentum_offset:momentum_offset + numel].view(shape)
                update = muon_update(gradient, momentum, group["momentum"], group["ns_method"]).reshape(-1)
                low, high = buffer.own_range(offset, offset + numel)
                partitions[index][low - buffer.partition_start:high - buffer.partition_start].copy_(
                    update[low - offset:high - offset])
            if self.partitioned_momentum:
                staged = buffer.partition_of(staged).clone()
            self.pending[id(master)] = staged
            del whole

    @torch.no_grad()
    def step(self, gradients: list[list[torch.Tensor]]) -> None:  # type: ignore[override]
        """Phase 4: commit the staged momentum; Muon masters take their updates, AdamW's their Adam step."""
        for group, group_updates in zip(self.param_groups, gradients):
            for master, update in zip(group["params"], group_updates):
                if not group["use_muon"]:
                    self._update(master, update, group)
                    continue
                self.state[master]["momentum_buffer"] = self.pending.pop(id(master))  # the staged copy, kept
                master.mul_(1 - float(group["lr"]) * group["weight_decay"])
                master.add_(update, alpha=-float(group["lr"]))

