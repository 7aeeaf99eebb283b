"""What a ZeRO optimizer holds, in bytes per category: the measured side of `memory_formula`.

The categories are the vocabulary's (`zero_lab.nano`), counted from the live tensors of one rank:
parameter partitions and gathered buffers, fp32 masters, Adam's states, gradient partitions,
full gradients and communication buckets, each in its place (device or host: `placement.py`, `offload/placement.py`).
The engine facade asks it (`engine.memory_breakdown`); no stage imports the accounting.
"""

from __future__ import annotations

from zero_lab.nano.gradient_reduction import optional_bytes
from zero_lab.nano.memory.memory_formula import CATEGORIES
from zero_lab.nano.placement import TensorKind


def memory_breakdown(optimizer, by_device: bool = False) -> dict:
    """Bytes this rank holds per buffer category (see the vocabulary in zero_lab.nano) and their
    total; with `by_device`, the same per place: {"device": {...}, "host": {...}} (the host
    holds what offload moved there; see offload/placement.py)."""
    places: dict[str, dict[str, int]] = {}

    def add(place: str, category: str, nbytes: int) -> None:
        figures = places.setdefault(place, dict.fromkeys(CATEGORIES, 0))
        figures[category] += nbytes

    optimizer_place = optimizer.placement.place(TensorKind.OPTIMIZER)
    for buffer, master in zip(optimizer.buffers, optimizer.master_partitions):
        add(optimizer.placement.place(buffer.partition_kind), "parameters", buffer.parameter_bytes())
        add("device", "gathered_parameters", buffer.gathered_bytes())
        if master is not buffer.partition:
            add(optimizer_place, "fp32_master_partition", optional_bytes(master))
    add(optimizer_place, "optimizer_states", optimizer.partition_optimizer.state_bytes())
    for partition in optimizer.gradient_partitions:
        add(optimizer_place, "gradient_partition", optional_bytes(partition))
    add("device", "gradients", optimizer.gradient_collection.gradient_bytes())
    add("device", "communication_buckets",
        optimizer.reducer.in_flight_bytes() + optimizer.gradient_collection.filling_bucket_bytes())
    for figures in places.values():
        figures["total"] = sum(figures.values())
    if by_device:
        return places
    breakdown = {category: sum(figures[category] for figures in places.values()) for category in CATEGORIES}
    breakdown["total"] = sum(breakdown.values())
    return breakdown
