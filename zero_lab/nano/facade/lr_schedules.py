"""DeepSpeed's learning-rate schedules, with its parameter names, defaults and step-by-step values.

Each schedule sets every param group's "lr" at construction (iteration -1: the warm-up start) and
at each `step()`, which the engine calls after every applied optimizer step (not skipped ones).
Warm-up is "log" (lr rises with log(step + 1)) or "linear"; warmup_num_steps is at least 2. An
unknown warm-up type is warned about and read as "log", and a group whose lr is a tensor has it
filled in place, as in DeepSpeed.
"""

from __future__ import annotations

import logging
import math
from typing import Any

import torch

from zero_lab.nano.errors import NanoConfigError

logger = logging.getLogger(__name__)


def _per_group(optimizer: torch.optim.Optimizer, value: Any, name: str) -> list[float]:
    if isinstance(value, (list, tuple)):
        if len(value) != len(optimizer.param_groups):
            raise NanoConfigError(f"scheduler.params.{name} has {len(value)} values for "
                                  f"{len(optimizer.param_groups)} parameter groups; give one per group or a number")
        return list(value)
    return [value] * len(optimizer.param_groups)


class _Warmup:
    """Shared warm-up arithmetic: the fraction of the warm-up done at `last_batch_iteration`."""

    def __init__(self, optimizer: torch.optim.Optimizer, warmup_num_steps: int, warmup_type: str,
                 last_batch_iteration: int):
        if not isinstance(warmup_num_steps, int) or warmup_num_steps <= 0:
            raise NanoConfigError(f"scheduler.params.warmup_num_steps must be a positive integer, "
                                  f"not {warmup_num_steps!r}")
        if warmup_type not in ("log", "linear"):
            logger.warning("scheduler.params.warmup_type %r is not 'log' or 'linear'; using 'log', as DeepSpeed does",
                           warmup_type)
            warmup_type = "log"
        self.optimizer = optimizer
        self.warmup_num_steps = max(2, warmup_num_steps)
        self.warmup_type = warmup_type
        self.inverse_log_warm_up = 1.0 / math.log(self.warmup_num_steps)
        self.last_batch_iteration = last_batch_iteration

    def _warmup_fraction(self) -> float:
        if self.warmup_type == "log":
            return self.inverse_log_warm_up * math.log(self.last_batch_iteration + 1)
        return self.last_batch_iteration / self.warmup_num_steps

    def get_lr(self) -> list[float]:
        raise NotImplementedError

    def _apply(self) -> None:
        for group, lr in zip(self.optimizer.param_groups, self.get_lr()):
            if isinstance(group["lr"], torch.Tensor):
                group["lr"].fill_(lr)
            else:
                group["lr"] = lr
        self._last_lr = [group["lr"] for group in self.optimizer.param_groups]

    def step(self, last_batch_iteration: int | None = None) -> None:
        self.last_batch_iteration = self.last_batch_iteration + 1 if last_batch_iteration is None else last_batch_iteration
        self._apply()

    def get_last_lr(self) -> list[float]:
        return self._last_lr

    def state_dict(self) -> dict:
        return {"last_batch_iteration": self.last_batch_iteration}

    def load_state_dict(self, state: dict) -> None:
        self.last_batch_iteration = state["last_batch_iteration"]


class WarmupLR(_Warmup):
    """From warmup_min_lr to warmup_max_lr over warmup_num_steps, then constant."""

    def __init__(self, optimizer: torch.optim.Optimizer, warmup_min_lr: Any = 0.0, warmup_max_lr: Any = None,
                 warmup_num_steps: int = 1000, warmup_type: str = "log", last_batch_iteration: int = -1):
        super().__init__(optimizer, warmup_num_steps, warmup_type, last_batch_iteration)
        if warmup_max_lr is None:
            warmup_max_lr = [float(group["lr"]) for group in optimizer.param_groups]
        self.min_lrs = _per_group(optimizer, warmup_min_lr, "warmup_min_lr")
        self.max_lrs = _per_group(optimizer, warmup_max_lr, "warmup_max_lr")
        if last_batch_iteration == -1:
            self._apply()

    def _gamma(self) -> float:
        return self._warmup_fraction() if self.last_batch_iteration < self.warmup_num_steps else 1.0

    def get_lr(self) -> list[float]:
        if self.last_batch_iteration < 0:
            return list(self.min_lrs)
        gamma = self._gamma()
        return [low + (high - low) * gamma for low, high in zip(self.min_lrs, self.max_lrs)]


class WarmupDecayLR(WarmupLR):
    """WarmupLR, then linear decay to 0 at total_num_steps."""

    def __init__(self, optimizer: torch.optim.Optimizer, total_num_steps: int, warmup_min_lr: Any = 0.0,
                 warmup_max_lr: Any = 0.001, warmup_num_steps: int = 1000, warmup_type: str = "log",
                 last_batch_iteration: int = -1):
        self.total_num_steps = total_num_steps
        super().__init__(optimizer, warmup_min_lr, warmup_max_lr, warmup_num_steps, warmup_type, last_batch_iteration)

    def _gamma(self) -> float:
        if self.last_batch_iteration < self.warmup_num_steps:
            return self._warmup_fraction()
        return max(0.0, float(self.total_num_steps - self.last_batch_iteration) /
                   float(max(1.0, self.total_num_steps - self.warmup_num_steps)))


class WarmupCosineLR(_Warmup):
    """Ratio of each group's initial lr: warm-up from warmup_min_ratio to 1, then cosine to cos_min_ratio."""

    def __init__(self, optimizer: torch.optim.Optimizer, total_num_steps: int, warmup_min_ratio: float = 0.0,
                 warmup_num_steps: int = 1000, cos_min_ratio: float = 0.0001, warmup_type: str = "log",
                 last_batch_iteration: int = -1):
        super().__init__(optimizer, warmup_num_steps, warmup_type, last_batch_iteration)
        self.total_num_steps = total_num_steps
        self.warmup_min_ratio = warmup_min_ratio
        self.cos_min_ratio = cos_min_ratio
        self.org_lrs = [float(group["lr"]) for group in optimizer.param_groups]
        if last_batch_iteration == -1:
            self._apply()

    def get_lr_ratio(self) -> float:
        if self.last_batch_iteration < 0:
            return 0.0
        if self.last_batch_iteration < self.warmup_num_steps:
            return self.warmup_min_ratio + self._warmup_fraction() * (1.0 - self.warmup_min_ratio)
        real_last_step = self.last_batch_iteration - self.warmup_num_steps + 1
        real_total_steps = max(1, self.total_num_steps - self.warmup_num_steps)
        progress = min(1.0, real_last_step / real_total_steps)
        ratio = (1 + math.cos(math.pi * progress)) / 2
        return max(0.0, self.cos_min_ratio + (1.0 - self.cos_min_ratio) * ratio)

    def get_lr(self) -> list[float]:
        ratio = self.get_lr_ratio()
        return [lr * ratio for lr in self.org_lrs]


SCHEDULES = {"WarmupLR": WarmupLR, "WarmupDecayLR": WarmupDecayLR, "WarmupCosineLR": WarmupCosineLR}


def build_scheduler(name: str, params: dict, optimizer: torch.optim.Optimizer):
    """The named schedule over `optimizer`; a wrong parameter name is a one-line config error."""
    try:
        return SCHEDULES[name](optimizer, **params)
    except TypeError as error:
        raise NanoConfigError(f"scheduler.params for {name} are wrong ({error}); see DeepSpeed's {name} docs") from None
