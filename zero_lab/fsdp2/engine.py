"""`Fsdp2Engine`: an FSDP2-sharded module behind DeepSpeed's engine calls, so the harness trains
it with the same loop as nano and official DeepSpeed (`engine(**batch)`, `engine.backward(loss)`,
`engine.step()` once per micro-step).

One optimizer step, over `gradient_accumulation_steps` micro-steps:
    Phase 1 `forward`: FSDP2's pre-forward hooks all-gather each unit (a block, then the root's
            own parameters) and, at stage 3, free it again after its forward.
    Phase 2 `backward`: the loss divided by the accumulation steps (DeepSpeed's scale_wrt_gas);
            on the window's last micro-step gradient sync is on (`set_requires_gradient_sync`),
            so each unit's post-backward reduce-scatters its gradients into the sharded
            parameters' `.grad`; earlier micro-steps keep unsharded gradients locally.
    Phase 3 `step`: at the window's end, the global norm of the sharded gradients (one
            all_reduce of the squared local norms), clipping as clip_grad_norm_ does, the torch
            optimizer's step on the local shards, the schedule's next lr, then zero_grad.
"""

from __future__ import annotations

import math
from typing import Any, Optional

import torch
import torch.distributed as dist

from zero_lab.fsdp2.config_map import Fsdp2Plan

CLIP_EPSILON = 1e-6  # clip_grad_norm_'s (and DeepSpeed's) guard against a zero norm


class Fsdp2Engine:
    def __init__(self, module: torch.nn.Module, plan: Fsdp2Plan, optimizer: torch.optim.Optimizer,
                 lr_scheduler: Any, device: torch.device, warnings: list[str], samples_per_step: int = 0):
        self.module = module
        self.plan = plan
        self.optimizer = optimizer
        self.lr_scheduler = lr_scheduler
        self.device = device
        self.warnings = warnings
        self.compute_dtype = getattr(torch, plan.param_dtype) if plan.param_dtype else torch.float32
        self.micro_steps = 0
        self.global_steps = 0
        self.skipped_steps = 0  # torch.optim never skips a step
        self.samples_per_step = samples_per_step  # the global batch: micro batch x accumulation x ranks
        self.global_samples = 0
        self._grad_norm: Optional[float] = None

    # Phase 1
    def __call__(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    forward = __call__

    # Phase 2
    def backward(self, loss: torch.Tensor) -> torch.Tensor:
        accumulation = self.plan.gradient_accumulation_steps
        if accumulation > 1:
            loss = loss / accumulation
        self.module.set_requires_gradient_sync(self.is_gradient_accumulation_boundary())
        loss.backward()
        return loss

    # Phase 3
    def step(self) -> None:
        if self.is_gradient_accumulation_boundary():
            norm = self.clip_gradients()
            self._grad_norm = norm
            self.optimizer.step()
            if self.lr_scheduler is not None:
                self.lr_scheduler.step()
            self.optimizer.zero_grad(set_to_none=True)
            self.global_steps += 1
            self.global_samples += self.samples_per_step
        self.micro_steps += 1

    def clip_gradients(self) -> float:
        """The global L2 norm of the gradients (each rank's local shards, summed over ranks), and
        every gradient scaled by max_norm / (norm + 1e-6) when that is below 1."""
        gradients = [parameter.grad.to_local() for parameter in self.module.parameters() if parameter.grad is not None]
        squares = torch.zeros((), dtype=torch.float32, device=self.device)
        for gradient in gradients:
            squares += gradient.detach().float().pow(2).sum().to(self.device)
        if dist.get_world_size() > 1:
            dist.all_reduce(squares, op=dist.ReduceOp.SUM)
        norm = squares.sqrt().item()
        # gloo's worker thread may hold the all_reduce's tensor a moment after the wait: release its
        # bytes now, so what a rank holds between steps does not depend on thread timing.
        squares.untyped_storage().resize_(0)
        if self.plan.gradient_clipping > 0 and math.isfinite(norm):
            coefficient = self.plan.gradient_clipping / (norm + CLIP_EPSILON)
            if coefficient < 1:
                for gradient in gradients:
                    gradient.mul_(coefficient)
        return norm

    def is_gradient_accumulation_boundary(self) -> bool:
        return (self.micro_steps + 1) % self.plan.gradient_accumulation_steps == 0

    def zero_optimization_stage(self) -> int:
        return self.plan.stage

    def gradient_accumulation_steps(self) -> int:
        return self.plan.gradient_accumulation_steps

    def get_global_grad_norm(self) -> Optional[float]:
        return self._grad_norm

    def get_lr(self) -> list[float]:
        return [float(group["lr"]) for group in self.optimizer.param_groups]

    def save_checkpoint(self, save_dir: str, tag: str | None = None, save_latest: bool = True, **_ignored: Any) -> str:
        """A DCP checkpoint of the sharded module, optimizer, schedule and counters (`checkpoint.save`)."""
        from zero_lab.fsdp2 import checkpoint

        return checkpoint.save(self, save_dir, tag, save_latest)

    def load_checkpoint(self, load_dir: str, tag: str | None = None, **_ignored: Any):
        """(path, client state) as DeepSpeed returns them, or (None, None) without `latest`."""
        from zero_lab.fsdp2 import checkpoint

        return checkpoint.load(self, load_dir, tag)
