"""`deepspeed.runtime`: the engine, the ZeRO contexts and the LR schedules, as nano's."""

from deepspeed.runtime import engine, lr_schedules, zero

__all__ = ["engine", "lr_schedules", "zero"]
