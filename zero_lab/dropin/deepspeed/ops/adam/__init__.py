"""`deepspeed.ops.adam`: DeepSpeedCPUAdam and FusedAdam, nano's (`zero_lab.nano.facade.client_optimizers`).

Official DeepSpeed compiles a kernel for each; here each is torch's Adam with DeepSpeed's arguments
(AdamW's decoupled decay with `adamw_mode`/`adam_w_mode`, the default), so a step outside an engine
is torch's, and `deepspeed.initialize(optimizer=...)` takes either as it takes torch's Adam and AdamW.
accelerate hands a user's optimizer over as DeepSpeedCPUAdam when the optimizer is offloaded.
"""

from zero_lab.nano.facade.client_optimizers import DeepSpeedCPUAdam, FusedAdam

__all__ = ["DeepSpeedCPUAdam", "FusedAdam"]
