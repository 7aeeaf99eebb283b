"""The engine facade: DeepSpeed's engine calls over one ZeRO optimizer.

Per micro-step the training loop calls, as with DeepSpeed:
    Phase 1 `engine(batch)`: the module's forward, unchanged (the model knows nothing of ZeRO; at
             stage 3 hooks put on it from outside gather each unit for its use).
    Phase 2 `engine.backward(loss)`: the loss is divided by the accumulation steps (and multiplied
             by the fp16 loss scale); stages 2 and 3 reduce gradient buckets as backward produces
             them, then the optimizer's `after_backward` finishes what backward left.
    Phase 3 `engine.step()`: at an accumulation boundary the ZeRO optimizer steps, the learning-rate
             schedule advances unless the step was skipped (a non-finite gradient norm: an fp16
             overflow or a diverged run), and global_steps counts it; micro_steps counts every call.
The step itself, phase by phase and file by file, is in `zero_optimizer.py`'s docstring.
"""

from __future__ import annotations

from collections import OrderedDict
from contextlib import contextmanager
from typing import Any, Optional

import torch

from zero_lab.nano import stages
from zero_lab.nano.checkpoint import load, save
from zero_lab.nano.collectives import Collectives
from zero_lab.nano.config import NanoConfig
from zero_lab.nano.errors import CheckpointError, EngineUsageError
from zero_lab.nano.memory.optimizer_memory import memory_breakdown
from zero_lab.nano.zero_optimizer import ZeroOptimizer


class NanoEngine(torch.nn.Module):
    """What `zero_lab.nano.facade.initialize` returns first; mirrors DeepSpeedEngine's training API."""

    def __init__(self, module: torch.nn.Module, config: NanoConfig, optimizer: ZeroOptimizer, lr_scheduler: Any,
                 collectives: Collectives, device: torch.device, training_dataloader: Any = None,
                 raw_config: Optional[dict] = None):
        super().__init__()
        self.module = module
        self.nano_config = config  # the typed config nano runs by
        self.config = raw_config if raw_config is not None else config.model_dump(by_alias=True, exclude_unset=True)
        # ^ DeepSpeed's engine.config: the config dict as given (clients read it with .get)
        self.optimizer = optimizer
        self.lr_scheduler = lr_scheduler
        self.collectives = collectives
        self.device = device
        self.training_dataloader = training_dataloader
        self.global_steps = 0
        self.global_samples = 0
        self.micro_steps = 0
        self.skipped_steps = 0
        self._step_applied = False
        self._boundary_override: Optional[bool] = None  # set_gradient_accumulation_boundary
        self._inside_no_sync = False
        self.warnings: list[str] = []  # said once at start-up; the harness prints each as a [warn] line
        self.last_checkpoint: Optional[dict] = None  # {"tag", "bytes" (this rank's files), "seconds"} of the last save

    # Phase 1
    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    # Phase 2
    def backward(self, loss: torch.Tensor, retain_graph: bool = False, scale_wrt_gas: bool = True) -> torch.Tensor:
        if scale_wrt_gas and self.gradient_accumulation_steps() > 1:
            loss = loss / self.gradient_accumulation_steps()
        scaled = loss * self.optimizer.cur_scale if self.nano_config.fp16.enabled else loss
        scaled.backward(retain_graph=retain_graph)
        self.optimizer.after_backward()
        return loss  # divided by the accumulation steps, as DeepSpeed's backward returns it

    # Phase 3
    def step(self, lr_kwargs: Optional[dict] = None) -> None:
        if self._inside_no_sync:
            raise EngineUsageError("It is illegal to call Engine.step() inside no_sync context manager")
        self._step_applied = False
        if self.is_gradient_accumulation_boundary():
            self.optimizer.step()
            if self.optimizer.overflow:
                self.skipped_steps += 1
            else:
                self._step_applied = True
                if self.lr_scheduler is not None:
                    self.lr_scheduler.step(**(lr_kwargs or {}))
            self.global_steps += 1
            self.global_samples += self.train_batch_size()
            self._print_progress()
        self.micro_steps += 1

    def _print_progress(self) -> None:
        if self.collectives.rank == 0 and self.global_steps % self.nano_config.steps_per_print == 0:
            print(f"[nano] step={self.global_steps} skipped={self.skipped_steps} lr={self.get_lr()} "
                  f"loss_scale={self.optimizer.cur_scale:g}", flush=True)

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clear gradients between accumulation windows (step() already does); mid-window the
        accumulated gradients are kept, so a loop that calls this every micro-step stays correct."""
        if self.micro_steps % self.gradient_accumulation_steps() == 0:
            self.optimizer.zero_grad()

    def is_gradient_accumulation_boundary(self) -> bool:
        if self._boundary_override is not None:
            return self._boundary_override
        return (self.micro_steps + 1) % self.gradient_accumulation_steps() == 0

    def set_gradient_accumulation_boundary(self, is_boundary: bool) -> None:
        """Decide the boundary yourself, as with DeepSpeed: False before each micro-step of a window
        but the last, True before the last, then one step()."""
        self._boundary_override = bool(is_boundary)

    @contextmanager
    def no_sync(self):
        """Backward passes inside accumulate gradients locally, unreduced; step() inside is an
        error. Stages 0/1 reduce only at step(), so they allow it; stages 2/3 reduce during backward
        (the stage table's `reduces_during_backward`) and refuse it, as DeepSpeed does."""
        stage = self.zero_optimization_stage()
        if stages.of(stage).reduces_during_backward:
            raise EngineUsageError(f"no_sync context manager is incompatible with gradient partitioning logic "
                                   f"of ZeRO stage {stage}")
        if self._inside_no_sync:
            raise EngineUsageError("no_sync context manager reentry is unsupported")
        self._inside_no_sync = True
        try:
            yield
        finally:
            self._inside_no_sync = False

    def destroy(self) -> None:
        """Release the engine's hold on the model (hooks, gradient buffers), as DeepSpeed's destroy()."""
        self.optimizer.destroy()

    # DeepSpeed's checkpoints (checkpoint/save.py, checkpoint/load.py): its calls, its files, any world size
    def _check_checkpoints_supported(self) -> None:
        """An optimizer whose states the checkpoint files cannot hold says so (Muon's momentum: `muon/`)."""
        refusal = getattr(self.optimizer.partition_optimizer, "checkpoint_refusal", None)
        if refusal:
            raise CheckpointError(refusal)

    def save_checkpoint(self, save_dir: str, tag: Any = None, client_state: dict = {},  # noqa: B006 (DeepSpeed's; read only)
                        save_latest: bool = True) -> bool:
        """Every rank calls it; writes `<save_dir>/<tag>/` and then `latest`. True, as DeepSpeed returns."""
        self._check_checkpoints_supported()
        self.last_checkpoint = save.save_checkpoint(self, save_dir, tag, dict(client_state), save_latest)
        return True

    def load_checkpoint(self, load_dir: str, tag: Any = None, load_module_strict: bool = True,
                        load_optimizer_states: bool = True, load_lr_scheduler_states: bool = True,
                        load_module_only: bool = False) -> tuple[Optional[str], Optional[dict]]:
        """(path of the model-states file, client_state); (None, None) when `load_dir` has no `latest`."""
        self._check_checkpoints_supported()
        return load.load_checkpoint(self, load_dir, tag, load_module_strict, load_optimizer_states,
                                         load_lr_scheduler_states, load_module_only)

    # DeepSpeed's 16-bit weights for saving a model (the Trainer's and accelerate's save_model)
    def zero_gather_16bit_weights_on_model_save(self) -> bool:
        """Whether the config asks stage 3 to gather whole 16-bit weights when a model is saved."""
        zero = self.nano_config.zero_optimization
        return zero.stage3_gather_16bit_weights_on_model_save or zero.stage3_gather_fp16_weights_on_model_save

    def _zero3_consolidated_16bit_state_dict(self, exclude_frozen_parameters: bool = False) -> Optional[dict]:
        """Stage 3: the whole module's state dict on rank 0 (None elsewhere), in the parameters' dtype
        on the CPU, gathering one module's own parameters at a time. Every rank must call it. Tied
        parameters stay one tensor under each of their names, as in official DeepSpeed."""
        if not self.nano_config.zero_optimization.stage_facts.partitions_parameters:
            raise ValueError("this function requires ZeRO-3 mode")
        state: Optional[dict] = OrderedDict() if self.collectives.rank == 0 else None
        key_of: dict[torch.Tensor, str] = {}
        for prefix, module in self.module.named_modules():
            owners = {parameter.zero_lab_owner[1] for parameter in module.parameters(recurse=False)
                      if getattr(parameter, "zero_lab_owner", None) is not None}
            for index in owners:
                self.optimizer.hold_whole(index)
            if state is not None:
                for name, parameter in module.named_parameters(recurse=False):
                    if exclude_frozen_parameters and not parameter.requires_grad:
                        continue
                    key = f"{prefix}.{name}" if prefix else name
                    state[key] = state[key_of[parameter]] if parameter in key_of else parameter.detach().to(
                        "cpu", copy=True)  # a copy: the gathered buffer is freed below
                    key_of.setdefault(parameter, key)
                for name, buffer in module.named_buffers(recurse=False):
                    if buffer is not None and name not in module._non_persistent_buffers_set:
                        state[f"{prefix}.{name}" if prefix else name] = buffer.detach().to("cpu", copy=True)
            for index in owners:
                self.optimizer.let_go(index)
        return state

    def was_step_applied(self) -> bool:
        """False when the last boundary step was skipped (non-finite gradients) or step() was not at a boundary."""
        return self._step_applied

    # DeepSpeed's accessors
    def get_lr(self) -> list[float]:
        return [group["lr"] for group in self.optimizer.param_groups]

    def get_global_grad_norm(self) -> Optional[float]:
        return self.optimizer.global_grad_norm

    def train_batch_size(self) -> int:
        return self.nano_config.train_batch_size

    def train_micro_batch_size_per_gpu(self) -> int:
        return self.nano_config.train_micro_batch_size_per_gpu

    def gradient_accumulation_steps(self) -> int:
        return self.nano_config.gradient_accumulation_steps

    def zero_optimization_stage(self) -> int:
        return self.nano_config.zero_optimization.stage

    def loss_scale(self) -> float:
        """The configured static loss scale (0 = dynamic), as DeepSpeed's engine.loss_scale()."""
        return self.nano_config.fp16.loss_scale

    def current_loss_scale(self) -> float:
        """The scale the next backward will use (1.0 unless fp16)."""
        return self.optimizer.cur_scale

    def fp16_enabled(self) -> bool:
        return self.nano_config.fp16.enabled

    def bfloat16_enabled(self) -> bool:
        return self.nano_config.bf16.enabled

    # nano's observability
    def comm_stats(self) -> dict[str, dict[str, int]]:
        """Calls and bytes per collective type (all_reduce, reduce_scatter, ...) since the last reset."""
        return self.collectives.stats()

    def reset_comm_stats(self) -> None:
        self.collectives.reset_stats()

    def memory_breakdown(self, by_device: bool = False) -> dict:
        """Bytes this rank holds per category: parameters, gradients, fp32_master_partition,
        optimizer_states, gradient_partition, communication_buckets, and their total; with
        `by_device`, one such dict per place: {"device": {...}, "host": {...}} (offload moves states to the host)."""
        return memory_breakdown(self.optimizer, by_device)  # counted from outside: no stage imports the accounting
