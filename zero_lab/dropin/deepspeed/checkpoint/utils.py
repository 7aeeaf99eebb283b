"""`deepspeed.checkpoint.utils.clone_tensors_for_torch_save`."""

from __future__ import annotations

from typing import Any

import torch


def clone_tensors_for_torch_save(item: Any, device: torch.device = torch.device("cpu")) -> Any:
    """A copy of `item` (tensors, possibly nested in dicts, lists and tuples) whose tensors are
    detached clones on `device`: views into a flat buffer would otherwise save the whole buffer."""
    if torch.is_tensor(item):
        return item.detach().clone().to(device)
    if isinstance(item, dict):
        return type(item)((key, clone_tensors_for_torch_save(value, device)) for key, value in item.items())
    if isinstance(item, (list, tuple)):
        return type(item)(clone_tensors_for_torch_save(value, device) for value in item)
    return item
