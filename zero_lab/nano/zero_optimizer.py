"""The shape every ZeRO stage shares: flat buffers, master partitions, and one optimizer step.

Construction:
    Phase 1: the unit policy (`units.py`) and the parameter groups decide the flat buffers, one per
             unit and group, laid out for the stage (`layout.py`) on the compute device
             (`placement.py`); each takes rank 0's values, so every rank starts equal.
    Phase 2: fp32 master partitions: in fp32 a buffer's own partition *is* the master (no copy); in
             bf16/fp16, or with the optimizer offloaded, an fp32 copy of it in the optimizer's place.
    Phase 3: the stage's gradient collection (`GradientCollection`: when gradients are packed into
             buckets and reduced) and the bucket reducer; no gradient memory yet.
    Phase 4: Adam over the master partitions (optimizer-state partitions appear at the first step).

One step, file by file: a window of micro-steps, then `step` at the boundary, whose `# Phase k`
comments are the rows below (stage 3 is stage 2 plus the rows `stage3.py`'s docstring adds).
    engine(batch)                   engine.py        the module's forward
    engine.backward(loss)           engine.py        scale the loss, then autograd's backward
        stages 0/1                  (autograd)       gradients accumulate in param.grad
        stages 2/3                  stage2.py        `ArrivalPacking._on_gradient_ready` adds each
                                                     gradient into its buckets; a full bucket goes
                                    gradient_reduction  to `BucketReducer.launch`: reduced and added
                                                     into this rank's `gradient_partition`
      optimizer.after_backward()    zero_optimizer   the stage's `GradientCollection.after_backward`:
        stages 0/1                  stage0.py        `BoundaryPacking`: nothing, param.grad waits
        stages 2/3                  stage2.py        `ArrivalPacking`: reduce the buckets left
                                                     (unused parameters), `finish_all`
    engine.step() at the boundary   engine.py        `ZeroOptimizer.step`, then the LR schedule
      Phase 1 reduce gradients      zero_optimizer   `GradientCollection.reduce_at_boundary`, after
                                                     which the fp32 gradient partitions are complete
                                                     (in the optimizer's place: the host with
                                                     offload_optimizer):
        stages 0/1                  stage0.py        `BoundaryPacking` packs param.grad into buckets
                                                     and reduces them (all-reduce at 0,
                                                     reduce-scatter at 1)
        stages 2/3                  stage2.py        `ArrivalPacking`: nothing, done in backward
      Phase 2 unscale               zero_optimizer   fp16: divide by the loss scale
      Phase 2b updates              adamw.py, muon/  `prepare_updates`: Adam none; Muon whole matrices
      Phase 3 norm, skip, clip      zero_optimizer   `_global_norm`: partition sums of squares;
                                    stage0/stage1.py `_sum_over_ranks` is nothing at stage 0, an
                                                     all-reduce from stage 1 on. The norm is the
                                                     same on every rank, so a non-finite one (an
                                                     fp16 overflow, a diverged run) makes every
                                                     rank skip the step, no collective needed
                                                     (bf16 `check_grad_overflow: false` lets it
                                    stages.py        through where the table's
                                                     `applies_unchecked_bf16_steps`: 1 and 2);
                                    loss_scaler.py   `update_scale`; then clip
      Phase 4 Adam                  adamw.py         `PartitionedAdam.step` on the masters (on the
                                                     host with offload_optimizer)
      Phase 5 release               zero_optimizer   `_release_gradients`: no gradient memory until
                                                     the next window's backward
      Phase 6 publish               zero_optimizer   `_publish_parameters`, the stage's:
                                    stage0.py        `copy_master_into_partition` per buffer (an
                                    offload/placement offloaded master is converted on the host,
                                                     then moved, asynchronously when pinned)
                                    stage1.py        + each buffer's `after_step`: an all-gather
                                    flat_buffer.py   of the partitions (`gather_partitions`)
"""

from __future__ import annotations

import math
from typing import Optional

import torch

from zero_lab.nano import stages
from zero_lab.nano.adamw import PartitionedAdam
from zero_lab.nano.collectives import Collectives, free_storage, labelled
from zero_lab.nano.config import NanoConfig
from zero_lab.nano.dtypes import torch_dtype
from zero_lab.nano.flat_buffer import FlatParameterBuffer, WholeParameters
from zero_lab.nano.gradient_collection import GradientCollection
from zero_lab.nano.gradient_reduction import BucketReducer
from zero_lab.nano.layout import FlatLayout
from zero_lab.nano.loss_scaler import LossScaler
from zero_lab.nano.placement import Placement, TensorKind
from zero_lab.nano.units import Unit, split_groups_by_unit


class ZeroOptimizer:
    """Stage-independent ZeRO optimizer; each stage module says what differs (see the stage table)."""

    stage, variant = -1, ""  # each stage module's number (and variant, stages.py): its row, `stage_facts`
    GradientCollection = GradientCollection
    bucket_reducer = BucketReducer  # what reduces the gradient buckets (qgZ's sends them quantized)

    def __init__(self, model: torch.nn.Module, units: list[Unit], parameter_groups: list[dict], config: NanoConfig,
                 collectives: Collectives, placement: Placement, parameter_names: dict[torch.nn.Parameter, str],
                 parameter_source=WholeParameters):
        self.model = model
        self.stage_facts = stages.of(self.stage, self.variant)
        self.units = units
        self.config = config
        self.collectives = collectives
        self.placement = placement
        self.parameter_names = parameter_names
        self.parameter_source = parameter_source  # where Phase 1 reads parameters from (`zero.Init`'s: gathered)
        self.group_parameters = [list(group["params"]) for group in parameter_groups]  # as given: checkpoints' order
        self.dtype = torch_dtype(config.precision)
        self.communication_dtype = torch_dtype(config.communication_data_type or config.precision)
        # Phase 1: flat parameter buffers, identical on every rank.
        self.buffers: list[FlatParameterBuffer] = []
        self.unit_of_buffer: list[int] = []
        for unit_index, group_index, parameters in split_groups_by_unit(units, parameter_groups):
            buffer = self._flat_buffer(units[unit_index], parameters, group_index)
            buffer.synchronize(collectives)  # one buffer at a time: stage 3 never holds two whole
            for parameter in parameters:
                parameter.zero_lab_owner = (self, len(self.buffers))  # for zero.GatheredParameters
            self.buffers.append(buffer)
            self.unit_of_buffer.append(unit_index)
        # Phase 2: fp32 master partitions.
        self.master_partitions = [placement.master_for(buffer.partition, buffer.partition_kind)
                                  for buffer in self.buffers]
        # Phase 3: gradients.
        self.gradient_partitions: list[Optional[torch.Tensor]] = [None] * len(self.buffers)
        self.reducer = self.bucket_reducer(collectives, self._uses_reduce_scatter(),
                                     max_in_flight=2 if config.zero_optimization.overlap_comm else 0,
                                     average=config.gradient_allreduce_op == "mean",
                                     predivide=self.stage_facts.predivides and self._uses_reduce_scatter(),
                                     placement=placement)
        self.gradient_collection = self.GradientCollection(self)
        # Phase 4: the partition optimizer: Adam, over the groups' own dicts (a client's: its scheduler drives the lr).
        masters_of_group = [[master for buffer, master in zip(self.buffers, self.master_partitions)
                             if buffer.group_index == index] for index in range(len(parameter_groups))]
        if config.optimizer is not None:
            hyper, decoupled = config.optimizer.params, config.optimizer.decoupled_weight_decay
            self.partition_optimizer = PartitionedAdam(masters_of_group, parameter_groups, hyper.lr, hyper.betas,
                                                       hyper.eps, hyper.weight_decay, decoupled)
        else:  # a client's torch Adam/AdamW (client_optimizers.py): every group carries its options
            self.partition_optimizer = PartitionedAdam(masters_of_group, parameter_groups, **{
                key: parameter_groups[0][key] for key in ("lr", "betas", "eps", "weight_decay",
                                                          "decoupled_weight_decay")})
        self.loss_scaler = LossScaler(config.fp16)
        self.checks_overflow = (config.precision != "bf16" or config.bf16.check_grad_overflow
                                or not self.stage_facts.applies_unchecked_bf16_steps)
        self.overflow = False
        self.global_grad_norm: Optional[float] = None

    def _flat_buffer(self, unit: Unit, parameters: list[torch.nn.Parameter], group_index: int) -> FlatParameterBuffer:
        """Phase 1 for one unit's parameters of one group (stage 3 adds buffers sharded between uses)."""
        layout = self._layout(parameters)
        full = self.placement.empty(TensorKind.COMPUTE, layout.padded_numel, self.dtype)
        return FlatParameterBuffer(parameters, layout, self.collectives, group_index, full, self.parameter_source)

    def copy_master_into_partition(self, index: int) -> None:
        """Buffer `index`'s master into its partition, in the parameters' dtype (none to copy when
        the partition is its own master)."""
        master, partition = self.master_partitions[index], self.buffers[index].partition
        if master is not partition:
            self.placement.copy(partition, master)

    def _layout(self, parameters: list[torch.nn.Parameter]) -> FlatLayout:
        numels = tuple(self.parameter_source.shape(parameter).numel() for parameter in parameters)
        return FlatLayout.for_stage(numels, self.stage, self.config.precision, self.collectives.world_size)

    # ----- what each stage decides ---------------------------------------------------------
    def _uses_reduce_scatter(self) -> bool:
        """Whether a bucket is reduce-scattered (each rank receives its share) or all-reduced."""
        raise NotImplementedError

    def _sum_over_ranks(self, squares: torch.Tensor) -> None:
        """Complete the sum of squared gradients when ranks hold different partitions."""
        raise NotImplementedError

    def _publish_parameters(self) -> None:
        """Step Phase 5: the updated masters become the parameters the next forward uses."""
        raise NotImplementedError

    # ----- gradient partitions --------------------------------------------------------------
    def gradient_partition(self, index: int, overwritten: bool = False) -> torch.Tensor:
        """Buffer `index`'s fp32 gradient partition, allocated on first use in a window (zeroed unless `overwritten`)."""
        if self.gradient_partitions[index] is None:
            allocate = self.placement.empty if overwritten else self.placement.zeros
            self.gradient_partitions[index] = allocate(TensorKind.OPTIMIZER, self.buffers[index].layout.partition_numel,
                                                       torch.float32)
        return self.gradient_partitions[index]

    def after_backward(self) -> None:
        """Called by the engine after every loss.backward(), at the boundary or not."""
        self.gradient_collection.after_backward()

    def _release_gradients(self) -> None:
        """Free the window's gradients; each partition is shrunk, not just dropped, since a view of
        it handed to a collective (stage 0's in-place buckets) may still be held by the backend's
        worker thread after the wait."""
        self.gradient_collection.release()
        for partition in self.gradient_partitions:
            if partition is not None:
                free_storage(partition)
        self.gradient_partitions = [None] * len(self.buffers)

    # ----- the shared step ----------------------------------------------------------------
    @torch.no_grad()
    def step(self) -> None:
        # Phase 1: reduce gradients: stages 0/1 now, stages 2/3 did in backward; then the gradient
        # partitions are complete (summed over ranks, averaged).
        with labelled("reduce_gradients"):
            self.gradient_collection.reduce_at_boundary()
        partitions = [self.gradient_partition(index) for index in range(len(self.buffers))]
        # Phase 2: unscale.
        scale = self.loss_scaler.loss_scale
        if scale != 1.0:
            for partition in partitions:
                partition.div_(scale)
        # Phase 2b: an optimizer reading whole matrices (Muon, `muon/`) turns gradients into updates.
        self.partition_optimizer.prepare_updates(partitions)
        # Phase 3: global norm; skip on non-finite; clip (torch.nn.utils.clip_grad_norm_'s coefficient).
        with labelled("unscale_clip"):
            self.global_grad_norm = self._global_norm(partitions)
        self.overflow = self.checks_overflow and not math.isfinite(self.global_grad_norm)
        self.loss_scaler.update_scale(self.overflow)
        if self.overflow:
            self.global_grad_norm = math.inf
            self._release_gradients()
            return
        max_norm = self.config.gradient_clipping
        if max_norm > 0:
            coefficient = max_norm / (self.global_grad_norm + 1e-6)
            if coefficient < 1.0:
                for partition in partitions:
                    partition.mul_(coefficient)
        # Phase 4: Adam on the master partitions, each with its buffer's gradient partition.
        gradients_of_group = [[partition for buffer, partition in zip(self.buffers, partitions)
                               if buffer.group_index == index] for index in range(len(self.param_groups))]
        self.partition_optimizer.step(gradients_of_group)
        del partitions, gradients_of_group
        # Phase 5: no gradient memory until the next backward; a publish's temporary takes its place.
        self._release_gradients()
        # Phase 6
        with labelled("all_gather"):
            self._publish_parameters()

    def _global_norm(self, partitions: list[torch.Tensor]) -> float:
        size = 1 << (16 if all(p.is_cpu for p in partitions) else 22)  # a CPU's BLAS sums 2^16 exactly
        dots = [torch.dot(piece, piece) for p in partitions  # a dot allocates nothing; a short partition is one piece
                for piece in ((p,) if p.numel() <= size else p.split(size))]
        squares = torch.stack(dots or [torch.zeros(())]).sum(dtype=torch.float64)  # float64 over the pieces
        squares = squares.reshape(1).to(self.placement.device)  # nccl sums device tensors
        self._sum_over_ranks(squares := squares.float())  # the ranks' sums: 4 bytes, in float32
        norm = math.sqrt(float(squares.item()))
        free_storage(squares)  # the backend's worker may still hold it
        return norm

    # ----- whole parameters on request (zero.GatheredParameters) ----------------------------------
    def hold_whole(self, index: int) -> None:
        """Make buffer `index` whole until `let_go` (below stage 3 it always is)."""

    def let_go(self, index: int) -> None:
        """The end of a `hold_whole`."""

    @torch.no_grad()
    def adopt_values(self, index: int, source_rank: int) -> None:
        """Rank `source_rank`'s values of whole buffer `index` become every rank's, masters included."""
        buffer = self.buffers[index]
        self.collectives.broadcast(buffer.full, source_rank=source_rank)
        buffer.partition.copy_(buffer.partition_of(buffer.full))  # a no-op where the partition is a view
        master = self.master_partitions[index]
        if master is not buffer.partition:
            master.copy_(buffer.partition)

    def zero_grad(self, set_to_none: bool = True) -> None:
        self._release_gradients()

    @torch.no_grad()
    def adopt_masters(self) -> None:
        """After a checkpoint load replaced the masters: drop the window's gradients and publish the
        masters as the parameters, as a step's Phases 5 and 6 do."""
        self._release_gradients()
        self._publish_parameters()

    def destroy(self) -> None:
        """Let go of the model: no hook of this optimizer stays on a parameter, no gradient buffer
        stays allocated, and the parameters may join a new engine (which copies them in)."""
        self.gradient_collection.destroy()
        self._release_gradients()
        for buffer in self.buffers:
            for parameter in buffer.parameters:
                parameter.zero_lab_flat_buffer = False
                parameter.zero_lab_owner = None

    # ----- DeepSpeed's optimizer attributes --------------------------------------------------
    @property
    def optimizer(self) -> PartitionedAdam:
        """DeepSpeed's name for the torch optimizer a ZeRO optimizer wraps: the partition optimizer (Adam, or Muon)."""
        return self.partition_optimizer

    @property
    def param_groups(self) -> list[dict]:
        return self.partition_optimizer.param_groups

    @property
    def dynamic_loss_scale(self) -> bool:
        """True with fp16's dynamic loss scaling (loss_scale 0), as DeepSpeed's optimizers say."""
        return self.loss_scaler.dynamic

    @property
    def cur_scale(self) -> float:
        return self.loss_scaler.loss_scale

    @property
    def loss_scale(self) -> float:
        return self.loss_scaler.loss_scale
