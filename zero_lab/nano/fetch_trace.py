"""Stage 3's trace: the uses of the modules one micro-step made, which the fetch rules read.

Every module a micro-step calls (containers and modules without parameters too, as
official traces every sub-module; none inside a leaf module) is a `TracedUse`, in the order the
forward calls them, the model first; then the backward's uses, in the order their outputs'
gradients arrive (the rules' `full_order`; without a recorded backward: the model, then the rest reversed).
`unit_gathering` records it; `fetch_policy`'s rules (and `zero-lab explain`) read it. No torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Hashable


@dataclass(frozen=True)
class TracedUse:
    """One use of a traced module: which module, which sharded unit it needs whole (None: only
    persistent parameters, or none), the elements of every parameter it touches, and the units of
    the parameters it uses but does not own (`external_parameters`), which it needs whole too."""

    module: Hashable
    unit: str | None
    numel: int
    external: tuple[str, ...] = ()

    @property
    def units(self) -> tuple[str, ...]:
        """Every unit the use needs whole, its own first."""
        own = (self.unit,) if self.unit is not None else ()
        return own + tuple(unit for unit in self.external if unit != self.unit)

