"""`deepspeed.ops.adam`: DeepSpeedCPUAdam and FusedAdam, as torch's Adam with DeepSpeed's arguments.

Official DeepSpeed compiles a C++ (CPU) or CUDA kernel for each; both compute Adam, or AdamW with
`adamw_mode`/`adam_w_mode` (the default). Here each is torch.optim.Adam with those arguments mapped
(decoupled_weight_decay = the AdamW mode), so a step outside an engine is torch's. Given to
`deepspeed.initialize(optimizer=...)`, nano reads their hyper-parameters and groups as it reads
torch's Adam and AdamW and runs its own ZeRO Adam (the same math) over the partitions.
accelerate hands a user's optimizer over as DeepSpeedCPUAdam when the optimizer is offloaded.
"""

from __future__ import annotations

import torch

from zero_lab.nano.errors import NanoConfigError


class _DeepSpeedAdam(torch.optim.Adam):
    """torch's Adam under a DeepSpeed name; `steps_as_torch_adam` tells nano's engine it may take it."""

    steps_as_torch_adam = True

    def __init__(self, model_params, lr: float, bias_correction: bool, betas: tuple[float, float], eps: float,
                 weight_decay: float, amsgrad: bool, adamw_mode: bool):
        if not bias_correction:
            raise NanoConfigError(f"{type(self).__name__}(bias_correction=False) is not implemented by nano "
                                  "(its Adam always corrects the bias, as torch's does); leave it out")
        super().__init__(model_params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, amsgrad=amsgrad,
                         decoupled_weight_decay=adamw_mode)


class DeepSpeedCPUAdam(_DeepSpeedAdam):
    def __init__(self, model_params, lr: float = 1e-3, bias_correction: bool = True,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8, weight_decay: float = 0,
                 amsgrad: bool = False, adamw_mode: bool = True, fp32_optimizer_states: bool = True):
        if not fp32_optimizer_states:
            raise NanoConfigError("DeepSpeedCPUAdam(fp32_optimizer_states=False) is not implemented by nano "
                                  "(Adam's states are fp32); leave it out")
        super().__init__(model_params, lr, bias_correction, betas, eps, weight_decay, amsgrad, adamw_mode)


class FusedAdam(_DeepSpeedAdam):
    def __init__(self, params, lr: float = 1e-3, bias_correction: bool = True, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, adam_w_mode: bool = True, weight_decay: float = 0.0, amsgrad: bool = False,
                 set_grad_none: bool = True):
        super().__init__(params, lr, bias_correction, betas, eps, weight_decay, amsgrad, adam_w_mode)


__all__ = ["DeepSpeedCPUAdam", "FusedAdam"]
