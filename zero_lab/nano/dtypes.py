"""The one dtype map: DeepSpeed's precision names, the --dtype names users type, bytes, torch dtypes.

Pure data first (no torch import), so the CLI can check a --dtype without loading torch.
"""

from __future__ import annotations

PRECISION_OF_DTYPE_NAME = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}
DTYPE_NAME_OF_PRECISION = {precision: name for name, precision in PRECISION_OF_DTYPE_NAME.items()}
PRECISIONS = tuple(DTYPE_NAME_OF_PRECISION)
BYTES_OF_PRECISION = {"fp32": 4, "bf16": 2, "fp16": 2}


def torch_dtype(precision_or_name: str):
    """torch.float32 for 'fp32' or 'float32', and so on."""
    import torch

    name = DTYPE_NAME_OF_PRECISION.get(precision_or_name, precision_or_name)
    if name not in PRECISION_OF_DTYPE_NAME:
        raise ValueError(f"unknown precision {precision_or_name!r}; use one of {', '.join(PRECISION_OF_DTYPE_NAME)}")
    return getattr(torch, name)
