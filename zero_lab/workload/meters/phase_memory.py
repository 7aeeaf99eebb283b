"""Memory through one optimizer step: what a rank holds at the step's phase boundaries, for every
impl, and, for nano, its own account of which buffers make up those bytes.

The boundaries are those of the step's last micro-step (earlier micro-steps only accumulate):
    after_forward:  the loss exists; every activation saved for backward is alive;
    after_backward: the gradients exist (full `param.grad`, buckets or partitions, by stage);
    after_step:     the optimizer has updated the parameters and released what it could.
Each sample holds the live bytes then (`MemoryMeter.live_bytes`: tracked tensor storage on CPU,
`torch.cuda.memory_allocated` on CUDA) and the peak since the step began, so the peak of the
forward, of forward plus backward, and of the whole step can be told apart.

nano's `memory_breakdown()` names its buffers; the harness keeps the categories of the memory the
meter sees (on CUDA, what nano placed on the device; on CPU, host and device alike, since offloaded
buffers are CPU tensors the tracker counts too). What the live bytes hold beyond those categories
is the model's activations and temporary tensors: the rest.
"""

from __future__ import annotations

from dataclasses import dataclass, field

PHASES = ("after_forward", "after_backward", "after_step")


@dataclass(frozen=True)
class PhaseSample:
    """One rank's memory at one phase boundary of one step, in bytes."""

    phase: str
    live_bytes: int
    peak_bytes: int  # the peak since the step began (so far, not only within this phase)
    categories: dict[str, int] = field(default_factory=dict)  # nano's buffers; empty for other impls

    def fields(self, step: int) -> dict:
        """The `[phase]` line's fields (docs/log-format.md)."""
        return {"step": step, "phase": self.phase, "live_bytes": self.live_bytes, "peak_bytes": self.peak_bytes,
                **{f"{category}_bytes": nbytes for category, nbytes in self.categories.items()}}


def visible_categories(breakdown_by_place: dict[str, dict[str, int]], device_type: str) -> dict[str, int]:
    """nano's bytes per category (without the total) in the memory a meter on `device_type` sees.

    `breakdown_by_place` is `engine.memory_breakdown(by_device=True)`: {"device": {...}, "host": {...}}.
    """
    places = ("device",) if device_type == "cuda" else tuple(breakdown_by_place)
    categories: dict[str, int] = {}
    for place in places:
        for category, nbytes in breakdown_by_place.get(place, {}).items():
            if category != "total":
                categories[category] = categories.get(category, 0) + nbytes
    return categories
