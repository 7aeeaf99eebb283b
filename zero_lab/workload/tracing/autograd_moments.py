"""The backward's gradient computation, watched from outside every engine for a timeline (`--trace`).

An engine's `backward(loss)` does more than compute gradients: official DeepSpeed and nano at
stages 0 and 1 reduce them at its end, after autograd has finished; stage 2 and 3 engines reduce
each bucket from autograd's own hooks, while autograd goes on. What a collective can overlap is
the computation around it, so a timeline marks where autograd itself runs: every engine (nano,
official DeepSpeed, FSDP2, a script's) reaches it through `torch.autograd.backward`
(`Tensor.backward` calls it), and a `torch.autograd.grad` call is autograd too.

Phase 1: `watch(observer)` wraps both functions of `torch.autograd`.
Phase 2: each call tells `observer("autograd", "autograd", True)` before it runs and
         `(..., False)` once it has returned (the gradients are made, and every hook autograd ran,
         a stage-2 bucket's reduction included, has returned).
Phase 3: the returned function puts the originals back.
"""

from __future__ import annotations

from typing import Callable

import torch

Observer = Callable[[str, str, bool], None]
WATCHED = ("backward", "grad")  # the functions of torch.autograd that run the autograd engine
SPAN = "autograd"


def watch(observer: Observer) -> Callable[[], None]:
    """Phases 1 and 3: returns `unwatch`."""
    originals = {name: getattr(torch.autograd, name) for name in WATCHED}

    def told(original):
        def call(*args, **kwargs):
            observer("autograd", SPAN, True)
            try:
                return original(*args, **kwargs)
            finally:
                observer("autograd", SPAN, False)
        call.__wrapped__ = original
        return call

    for name, original in originals.items():
        setattr(torch.autograd, name, told(original))

    def unwatch() -> None:
        for name, original in originals.items():
            setattr(torch.autograd, name, original)

    return unwatch
