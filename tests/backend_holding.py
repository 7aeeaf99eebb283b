"""A backend that keeps every tensor handed to a collective referenced until the block ends.

gloo's worker thread sometimes still holds a finished collective's tensors (through its work
object) for a moment after `wait()` returns. A storage an engine drops by reference, rather than by
shrinking it, then stays alive or not depending on that thread's timing: CI saw 4 bytes more at
world size 3 (FSDP2's norm scalar) and 176 bytes more at world size 2 (nano stage 0's last gradient
partition). Inside `backend_holding_collective_tensors()` every such tensor is held, as the slowest
thread would hold it, so a memory test measures what the engine itself leaves alive, every run.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

import torch
import torch.distributed

COLLECTIVES = ("all_reduce", "reduce_scatter", "reduce_scatter_tensor", "reduce_scatter_single", "all_gather",
               "all_gather_into_tensor", "all_gather_single", "all_to_all_single", "broadcast")


def _tensors(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [tensor for item in value for tensor in _tensors(item)]
    return []


@contextlib.contextmanager
def backend_holding_collective_tensors(names: tuple[str, ...] = COLLECTIVES) -> Iterator[list[torch.Tensor]]:
    """Patch torch.distributed's collectives `names` (looked up by attribute at call time, as nano and
    our FSDP2 engine call them) to hold their tensor arguments; yields the held list."""
    held: list[torch.Tensor] = []
    missing = [name for name in names if not hasattr(torch.distributed, name) and not name.endswith("_single")]
    if missing:  # a renamed collective would otherwise go unheld and the memory tests model no slow backend
        raise AttributeError(f"torch.distributed has no {missing}: update tests/backend_holding.py's COLLECTIVES")
    originals = {name: getattr(torch.distributed, name) for name in names if hasattr(torch.distributed, name)}

    def holding(original):
        def collective(*args, **kwargs):
            held.extend(_tensors(list(args) + list(kwargs.values())))
            return original(*args, **kwargs)
        return collective

    for name, original in originals.items():
        setattr(torch.distributed, name, holding(original))
    try:
        yield held
    finally:
        for name, original in originals.items():
            setattr(torch.distributed, name, original)
        held.clear()
