"""`deepspeed.runtime.zero.partition_parameters`: where clients find ZeRO-3's construction names.

transformers reads two names here around `zero.Init` (its `prevent_arange_dtype_change`):
`_orig_torch_arange` and `zero_wrapper_for_fp_tensor_constructor`, which it swaps for the length
of the block. Official DeepSpeed's Init wraps torch's tensor constructors with that function, so
floating tensors are built in the config's dtype on the accelerator. nano's Init does not wrap
constructors: parameters are built as torch builds them and cast at `initialize` (buffers never
are), so `torch.arange` here is torch's own, and the function below is what official would apply,
kept whole for a client that calls or swaps it. `register_external_parameter` and
`unregister_external_parameter` are nano's (`zero_lab/nano/external_parameters.py`), found here as in official.
"""

from __future__ import annotations

import os
from typing import Callable, Optional

import torch

from zero_lab.nano.zero import GatheredParameters, Init, register_external_parameter, unregister_external_parameter

from deepspeed.accelerator import get_accelerator

_orig_torch_arange = torch.arange  # nano's Init never replaces it


def zero_wrapper_for_fp_tensor_constructor(fn: Callable, target_fp_dtype: torch.dtype,
                                           target_device: Optional[torch.device] = None) -> Callable:
    """`fn` (a tensor constructor) building on `target_device` (default: this rank's device), with a
    floating result cast to `target_fp_dtype`."""
    def wrapped_fn(*args, **kwargs) -> torch.Tensor:
        if kwargs.get("device") is None:
            kwargs["device"] = torch.device(target_device or get_accelerator().device_name(
                int(os.environ.get("LOCAL_RANK", 0))))
        tensor = fn(*args, **kwargs)
        if tensor.is_floating_point():
            tensor.data = tensor.data.to(target_fp_dtype)
        return tensor

    return wrapped_fn


__all__ = ["Init", "GatheredParameters", "register_external_parameter", "unregister_external_parameter",
           "get_accelerator", "zero_wrapper_for_fp_tensor_constructor"]
