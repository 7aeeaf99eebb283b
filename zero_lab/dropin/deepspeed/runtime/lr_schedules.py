"""`deepspeed.runtime.lr_schedules`: nano's schedules under DeepSpeed's names.

VALID_LR_SCHEDULES lists the schedules nano implements (official lists more; nano's config refuses
the others in one line). accelerate recognises a DeepSpeed schedule object by its class name here.
"""

from zero_lab.nano.facade.lr_schedules import SCHEDULES, WarmupCosineLR, WarmupDecayLR, WarmupLR

VALID_LR_SCHEDULES = list(SCHEDULES)

__all__ = ["VALID_LR_SCHEDULES", "WarmupLR", "WarmupDecayLR", "WarmupCosineLR"]
