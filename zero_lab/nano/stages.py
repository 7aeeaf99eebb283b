"""The one table of ZeRO stages: which exist, what each partitions, and whether nano runs it.

The config, the memory formula, `initialize`, the CLI and the docs all read this table, so a new
stage is one row here (and its optimizer module), and a refusal reads the same everywhere.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Stage:
    number: int
    partitions: tuple[str, ...]  # what each rank holds only 1/N of
    summary: str
    implemented: bool = True


STAGES = (
    Stage(0, (), "plain data parallelism: every rank holds everything"),
    Stage(1, ("optimizer states",), "optimizer states partitioned"),
    Stage(2, ("optimizer states", "gradients"), "optimizer states and gradients partitioned"),
    Stage(3, ("optimizer states", "gradients", "parameters"), "parameters partitioned too, gathered for each use"),
)
BY_NUMBER = {stage.number: stage for stage in STAGES}
IMPLEMENTED = tuple(stage.number for stage in STAGES if stage.implemented)


def implemented_list() -> str:
    """'0, 1 or 2': the stages nano runs, for messages."""
    *first, last = [str(number) for number in IMPLEMENTED]
    return f"{', '.join(first)} or {last}" if first else last


def refusal(stage: object) -> str | None:
    """The one message for a stage nano cannot run (None when it can)."""
    if stage in IMPLEMENTED:
        return None
    if stage in BY_NUMBER:
        return (f"nano does not implement ZeRO stage {stage} yet; use stage {implemented_list()}, "
                "or run official DeepSpeed (--impl official)")
    return f"ZeRO stage {stage!r} does not exist; use stage {implemented_list()}"
