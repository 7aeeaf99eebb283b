"""A client's own torch optimizer handed to `initialize(optimizer=...)`: which nano takes, and how.

The Hugging Face Trainer passes its torch.optim.AdamW when the config has no "optimizer" section,
and accelerate passes a user's optimizer (as DeepSpeedCPUAdam when the optimizer is offloaded).
nano's ZeRO Adam (`adamw.py`) is torch's Adam/AdamW math, so it takes:
    torch.optim.Adam and torch.optim.AdamW (exactly those classes: a subclass may step otherwise),
    DeepSpeedCPUAdam and FusedAdam below (official DeepSpeed's names, as torch's Adam),
with their hyper-parameters and their parameter groups. The groups are the client's own dicts: the
engine puts its fp32 master partitions in their "params", as official DeepSpeed does with the basic
optimizer it wraps, so an LR scheduler built on the client's optimizer (a LambdaLR) keeps setting
the learning rate nano steps with. Any other optimizer, and Adam options nano's math does not have
(amsgrad, maximize), are refused in one line. Like official DeepSpeed, with the optimizer offloaded
and `zero_force_ds_cpu_optimizer` true (its default) only DeepSpeedCPUAdam is taken.
"""

from __future__ import annotations

from typing import Any, Callable, Union

import torch

from zero_lab.nano.config import NanoConfig
from zero_lab.nano.errors import NanoConfigError


class _DeepSpeedAdam(torch.optim.Adam):
    """torch's Adam under one of official DeepSpeed's names, with its arguments."""

    def __init__(self, params, lr: float, bias_correction: bool, betas: tuple[float, float], eps: float,
                 weight_decay: float, amsgrad: bool, adamw_mode: bool):
        if not bias_correction:
            raise NanoConfigError(f"{type(self).__name__}(bias_correction=False) is not implemented by nano "
                                  "(its Adam always corrects the bias, as torch's does); leave it out")
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, amsgrad=amsgrad,
                         decoupled_weight_decay=adamw_mode)


class DeepSpeedCPUAdam(_DeepSpeedAdam):
    """Official DeepSpeed's host Adam (a C++ op there); `adamw_mode` is AdamW's decoupled decay."""

    def __init__(self, model_params, lr: float = 1e-3, bias_correction: bool = True,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8, weight_decay: float = 0,
                 amsgrad: bool = False, adamw_mode: bool = True, fp32_optimizer_states: bool = True):
        if not fp32_optimizer_states:
            raise NanoConfigError("DeepSpeedCPUAdam(fp32_optimizer_states=False) is not implemented by nano "
                                  "(Adam's states are fp32); leave it out")
        super().__init__(model_params, lr, bias_correction, betas, eps, weight_decay, amsgrad, adamw_mode)


class FusedAdam(_DeepSpeedAdam):
    """Official DeepSpeed's fused CUDA Adam; `adam_w_mode` is AdamW's decoupled decay."""

    def __init__(self, params, lr: float = 1e-3, bias_correction: bool = True, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, adam_w_mode: bool = True, weight_decay: float = 0.0, amsgrad: bool = False,
                 set_grad_none: bool = True):
        super().__init__(params, lr, bias_correction, betas, eps, weight_decay, amsgrad, adam_w_mode)


TAKEN = (torch.optim.Adam, torch.optim.AdamW, DeepSpeedCPUAdam, FusedAdam)


def client_optimizer(optimizer: Union[torch.optim.Optimizer, Callable], model_parameters: Any,
                     config: NanoConfig) -> torch.optim.Optimizer:
    """The client's optimizer (a callable is called with `model_parameters`, as official does),
    checked: one nano can step, and no second optimizer in the config."""
    if config.optimizer is not None:
        raise NanoConfigError('an optimizer was given both in the config ("optimizer") and as optimizer=; keep one')
    if not isinstance(optimizer, torch.optim.Optimizer) and callable(optimizer):
        optimizer = optimizer(model_parameters)
    if type(optimizer) not in TAKEN:
        untested = (" (zero_allow_untested_optimizer lets official DeepSpeed take it, not nano)"
                    if config.zero_allow_untested_optimizer else "")
        raise NanoConfigError(f"client optimizer {type(optimizer).__name__} is not implemented by nano (it runs "
                              f"Adam and AdamW only){untested}; pass torch.optim.AdamW or Adam, or describe the "
                              "optimizer in the config's \"optimizer\" section")
    for group in optimizer.param_groups:
        for option in ("amsgrad", "maximize"):
            if group.get(option):
                raise NanoConfigError(f"{type(optimizer).__name__}({option}=True) is not implemented by nano's "
                                      f"Adam; leave {option} out")
    offloaded = config.zero_optimization.offload_optimizer.enabled
    if offloaded and config.zero_force_ds_cpu_optimizer and type(optimizer) is not DeepSpeedCPUAdam:
        raise NanoConfigError(f"with offload_optimizer, a client optimizer must be DeepSpeedCPUAdam (as official "
                              f"DeepSpeed requires), not {type(optimizer).__name__}; set "
                              "\"zero_force_ds_cpu_optimizer\": false to use it anyway")
    return optimizer


def adopt_groups(optimizer: torch.optim.Optimizer) -> list[dict]:
    """The client's parameter groups, as nano's: trainable parameters only, empty groups dropped
    from the client's own list too (as official does); each dict stays the client's."""
    for group in optimizer.param_groups:
        group["params"] = [parameter for parameter in group["params"] if parameter.requires_grad]
    optimizer.param_groups[:] = [group for group in optimizer.param_groups if group["params"]]
    return optimizer.param_groups
