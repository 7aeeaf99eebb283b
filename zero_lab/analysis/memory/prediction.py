"""A predicted step's data: bytes per rank at each moment of a step, split by place (the device's and
the host's), and what a run's config moves to the host. `peak_memory` (nano and official) and
`fsdp2_peak` (FSDP2) fill them in.
"""

from __future__ import annotations

from dataclasses import dataclass


PLACES = ("device", "host")


@dataclass(frozen=True)
class Offload:
    """What a run's config moves to the host: `offload_optimizer` (stages 1-3), `offload_param` (stage 3)."""

    optimizer: bool = False
    parameters: bool = False

    @property
    def optimizer_place(self) -> str:
        return "host" if self.optimizer else "device"

    def flags(self) -> dict[str, bool]:
        """As `memory_formula.model_state_bytes_by_place` takes them."""
        return {"offload_optimizer": self.optimizer, "offload_parameters": self.parameters}


NO_OFFLOAD = Offload()


def placed(device: int = 0, host: int = 0) -> dict[str, int]:
    return {"device": device, "host": host}


def added(*figures: dict[str, int]) -> dict[str, int]:
    """Place by place, the sum of several {"device": bytes, "host": bytes}."""
    return {place: sum(figure[place] for figure in figures) for place in PLACES}


@dataclass(frozen=True)
class PeakPrediction:
    """Predicted bytes per rank at each moment of a step, per place, and the peaks among them."""

    places: dict[str, dict[str, int]]  # moment -> {"device": bytes, "host": bytes}
    activations: int  # saved for the backward (what `turn` adds to the model states, with the loss's temporaries)
    # allocated and never written (official's staging buffer beyond the gradients it stages): counted in the
    # peak, as the caching allocator and the storage tracker count it, but never resident in a CPU's memory
    untouched: int = 0
    # of `untouched`, what exists once the engine is built (official's stage-3 reduce bucket)
    untouched_at_initialize: int = 0
    # on a CPU, freed bytes the heap keeps at the peak beside the live tensors (`heap_kept`): resident, not allocated
    heap_kept: int = 0
    # on CUDA, freed bytes the caching allocator keeps reserved beyond the tensors' peak (`cuda.cached`)
    cached: int = 0

    @property
    def moments(self) -> dict[str, int]:
        """Each moment's bytes in one memory, device and host together, as a CPU run holds them."""
        return {moment: sum(figures.values()) for moment, figures in self.places.items()}

    @property
    def moment(self) -> str:
        return max(self.moments, key=self.moments.get)

    peak = property(lambda self: self.moments[self.moment])

    def peak_in(self, place: str) -> int:
        """The most one place holds at any moment (the two places may peak at different moments)."""
        return max(figures[place] for figures in self.places.values())

    def peak_seen_on(self, device_type: str) -> int:
        """The peak a run's memory meter on `device_type` measures: CUDA's allocator counts the device
        alone, the CPU storage tracker every tensor of both places."""
        return self.peak_in("device") if device_type == "cuda" else self.peak
