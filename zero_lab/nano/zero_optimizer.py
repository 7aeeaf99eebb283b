"""The shape every ZeRO stage shares; stages 0, 1 and 2 differ only where gradients live.

Construction:
    Phase 1: flatten each parameter group into a FlatParameterGroup (one partition at stage 0,
             world-size partitions above) and broadcast rank 0's values, so all ranks start equal.
    Phase 2: the fp32 master partition: in fp32 the flat buffer's own partition *is* the master (no
             copy); in bf16/fp16 an fp32 copy of it.
    Phase 3: the stage's gradient machinery (`_build_gradients`); gradient buffers themselves
             are allocated when a window's first gradient arrives and released after the step, so
             between steps a rank holds only parameters, master and optimizer-state partitions.
    Phase 4: Adam over the master partitions (optimizer-state partitions appear at the first step).
Optimizer step, at each gradient-accumulation boundary:
    Phase 1: the stage completes the gradient partitions (`_complete_gradient_partitions`).
    Phase 2: fp16: unscale by the loss scale.
    Phase 3: the global gradient norm (partition sums of squares, summed over ranks). It is the
             same number on every rank, so a non-finite norm (an inf or NaN gradient on any rank:
             an fp16 overflow, or a diverged fp32/bf16 run) makes every rank skip the step
             without another collective (unless bf16's `check_grad_overflow` is false); then clip.
    Phase 4: Adam on the master partitions.
    Phase 5: master -> own partition of the flat buffer (mixed precision), then all-gather every
             partition into every rank's flat buffer (stages 1/2), bucketed.
    Phase 6: release the gradient buffers until the next window's backward.
"""

from __future__ import annotations

import math
from typing import Optional

import torch

from zero_lab.nano.adamw import PartitionedAdam
from zero_lab.nano.collectives import Collectives, free_storage
from zero_lab.nano.config import NanoConfig
from zero_lab.nano.flat_buffer import FlatParameterGroup
from zero_lab.nano.layout import FlatLayout
from zero_lab.nano.gradient_reduction import BucketReducer, gather_partitions, optional_bytes
from zero_lab.nano.loss_scaler import LossScaler

PRECISION_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


class ZeroOptimizer:
    """Stage-independent ZeRO optimizer; subclasses say where gradients live and when they reduce."""

    stage = -1
    partitioned = True  # stage 0 overrides: every rank owns the whole buffer

    def __init__(self, parameter_groups: list[dict], config: NanoConfig, collectives: Collectives,
                 device: torch.device, parameter_names: dict[torch.nn.Parameter, str]):
        self.config = config
        self.collectives = collectives
        self.parameter_names = parameter_names
        self.dtype = PRECISION_DTYPES[config.precision]
        self.communication_dtype = PRECISION_DTYPES[config.communication_data_type or config.precision]
        # Phase 1: flat parameter buffers, identical on every rank.
        self.groups = [FlatParameterGroup(group["params"], self._layout(group["params"]), collectives.rank,
                                          self.dtype, device) for group in parameter_groups]
        for group in self.groups:
            collectives.broadcast(group.flat, source_rank=0)
        # Phase 2: fp32 master partitions.
        self.master_is_flat = self.dtype == torch.float32
        self.master_partitions = [group.partition_of(group.flat) if self.master_is_flat
                                  else group.partition_of(group.flat).to(torch.float32) for group in self.groups]
        # Phase 3: gradients.
        self.gradient_partitions: list[Optional[torch.Tensor]] = [None] * len(self.groups)
        self._build_gradients()
        self.reducer = BucketReducer(collectives, self._uses_reduce_scatter(),
                                     max_in_flight=2 if config.zero_optimization.overlap_comm else 0,
                                     average=config.gradient_allreduce_op == "mean")
        # Phase 4: Adam.
        optimizer_config = config.optimizer
        hyper = optimizer_config.params
        options = [{key: value for key, value in group.items() if key != "params"} for group in parameter_groups]
        self.optimizer = PartitionedAdam(self.master_partitions, options, hyper.lr, hyper.betas, hyper.eps,
                                         hyper.weight_decay, optimizer_config.decoupled_weight_decay)
        self.loss_scaler = LossScaler(config.fp16)
        self.checks_overflow = config.precision != "bf16" or config.bf16.check_grad_overflow
        self.overflow = False
        self.global_grad_norm: Optional[float] = None

    # ----- what each stage decides ---------------------------------------------------------
    def _layout(self, parameters: list[torch.nn.Parameter]) -> FlatLayout:
        return FlatLayout.for_stage(tuple(parameter.numel() for parameter in parameters), self.stage,
                                    self.config.precision, self.collectives.world_size)

    def _uses_reduce_scatter(self) -> bool:
        return self.partitioned and self.config.zero_optimization.reduce_scatter

    def _build_gradients(self) -> None:
        """Set up the stage's gradient machinery (no gradient memory yet)."""

    def _new_gradient_partition(self, index: int) -> torch.Tensor:
        """A zeroed fp32 gradient partition for group `index`."""
        group = self.groups[index]
        return torch.zeros(group.partition_numel, dtype=torch.float32, device=group.flat.device)

    def gradient_partition(self, index: int) -> torch.Tensor:
        """Group `index`'s fp32 gradient partition, allocated on first use in a window."""
        if self.gradient_partitions[index] is None:
            self.gradient_partitions[index] = self._new_gradient_partition(index)
        return self.gradient_partitions[index]

    def after_backward(self, boundary: bool) -> None:
        """Called by the engine after every loss.backward(); `boundary` ends an accumulation window."""

    def _complete_gradient_partitions(self) -> None:
        raise NotImplementedError

    def _release_gradients(self) -> None:
        self.gradient_partitions = [None] * len(self.groups)

    def _gradient_bytes(self) -> dict[str, int]:
        raise NotImplementedError

    def _filling_bucket_bytes(self) -> int:
        """Bytes of buckets still being filled by backward (stage 2 only)."""
        return 0

    # ----- the shared step ----------------------------------------------------------------
    @torch.no_grad()
    def step(self) -> None:
        # Phase 1: gradient partitions complete (summed over ranks, averaged).
        self._complete_gradient_partitions()
        partitions = [self.gradient_partition(index) for index in range(len(self.groups))]
        # Phase 2: unscale.
        scale = self.loss_scaler.loss_scale
        if scale != 1.0:
            for partition in partitions:
                partition.div_(scale)
        # Phase 3: global norm; skip on non-finite; clip (torch.nn.utils.clip_grad_norm_'s coefficient).
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
        # Phase 4: Adam on the master partitions.
        self.optimizer.step(partitions)
        del partitions
        # Phase 5: updated partitions back into every rank's flat buffer.
        for group, master in zip(self.groups, self.master_partitions):
            if not self.master_is_flat:
                group.partition_of(group.flat).copy_(master)
            gather_partitions(self.collectives, group, self.config.zero_optimization.allgather_bucket_size)
        # Phase 6: no gradient memory between steps.
        self._release_gradients()

    def _global_norm(self, partitions: list[torch.Tensor]) -> float:
        squares = torch.zeros(1, dtype=torch.float32, device=partitions[0].device)
        for partition in partitions:
            squares += partition.pow(2).sum()
        if self.partitioned:
            self.collectives.all_reduce(squares)
        norm = math.sqrt(float(squares.item()))
        free_storage(squares)  # the backend's worker may still hold it
        return norm

    def zero_grad(self, set_to_none: bool = True) -> None:
        self._release_gradients()

    def destroy(self) -> None:
        """Let go of the model: no hook of this optimizer stays on a parameter, no gradient buffer
        stays allocated, and the parameters may join a new engine (which copies them in)."""
        self._release_gradients()
        for group in self.groups:
            for parameter in group.parameters:
                parameter.zero_lab_flat_buffer = False

    # ----- observability -------------------------------------------------------------------
    def memory_breakdown(self) -> dict[str, int]:
        """Bytes this rank holds per buffer category (see the vocabulary in zero_lab.nano)."""
        breakdown = {
            "parameters": sum(optional_bytes(group.flat) for group in self.groups),
            "fp32_master_partition": 0 if self.master_is_flat else sum(map(optional_bytes, self.master_partitions)),
            "optimizer_states": self.optimizer.state_bytes(),
            **self._gradient_bytes(),
            "communication_buckets": self.reducer.in_flight_bytes() + self._filling_bucket_bytes(),
        }
        breakdown["total"] = sum(breakdown.values())
        return breakdown

    @property
    def param_groups(self) -> list[dict]:
        return self.optimizer.param_groups

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
