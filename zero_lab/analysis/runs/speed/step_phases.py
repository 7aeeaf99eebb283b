"""Memory through one step, as the report draws it: the `[phase]` samples of a run's last step, and
nano's categories stacked so that their sum is the live bytes (the ZeRO paper's figure, measured).

Phase 1: `last_step_phases` keeps the samples of the last step that has all three boundaries
         (`workload.meters.phase_memory.PHASES`), in that order; those fields go into summary.json.
Phase 2: `stacked_categories` folds nano's buffer categories into the figure's six: parameters
         (gathered ones included), gradients (full gradients and the gradient partition),
         buckets, master, optimizer states, and activations: the live bytes nano's buffers do not
         explain (saved activations and every other temporary).
"""

from __future__ import annotations

from zero_lab.workload.meters.phase_memory import PHASES

# The figure's categories, each the sum of nano's `memory_breakdown` categories.
STACKED = {
    "parameters": ("parameters", "gathered_parameters"),
    "gradients": ("gradients", "gradient_partition"),
    "buckets": ("communication_buckets",),
    "master": ("fp32_master_partition",),
    "optimizer states": ("optimizer_states",),
}
ACTIVATIONS = "activations"


def last_step_phases(phases: list[dict]) -> list[dict]:
    """Phase 1: the `[phase]` rows of the last step with every boundary, ordered as PHASES; [] if none."""
    by_step: dict[int, dict[str, dict]] = {}
    for row in phases:
        if isinstance(row.get("step"), int) and row.get("phase") in PHASES:
            by_step.setdefault(row["step"], {})[row["phase"]] = row
    complete = [step for step, rows in by_step.items() if len(rows) == len(PHASES)]
    if not complete:
        return []
    rows = by_step[max(complete)]
    return [rows[phase] for phase in PHASES]


def has_categories(phases: list[dict]) -> bool:
    """Whether the samples carry nano's categories (official's do not)."""
    return bool(phases) and all(f"{name}_bytes" in row for row in phases for names in STACKED.values() for name in names)


def stacked_categories(phases: list[dict]) -> dict[str, list[int]]:
    """Phase 2: per figure category, its bytes at each phase; the categories add up to live_bytes."""
    stacked = {label: [sum(row[f"{name}_bytes"] for name in names) for row in phases] for label, names in STACKED.items()}
    explained = [sum(values) for values in zip(*stacked.values())]
    stacked[ACTIVATIONS] = [row["live_bytes"] - known for row, known in zip(phases, explained)]
    return stacked
