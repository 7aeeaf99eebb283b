"""`deepspeed.ops`: the optimizers clients import by DeepSpeed's names (`ops.adam`)."""

from deepspeed.ops import adam

__all__ = ["adam"]
