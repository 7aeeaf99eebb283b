"""The labs, in course order: what each asks the learner to write, the formula it must meet, its hints.

A lab is a row here; `start` writes its package from it and `check` holds the learner's engine to
it. The functions to write live in zero_lab/labs/todo/<lab>.py (each raises NotImplementedError
naming the lab); the engine around them is zero_lab/labs/skeleton/ (it runs stage 0 as it is).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Lab:
    """One lab: its name, the stage its engine runs, and what the learner reads."""

    name: str
    title: str
    stage: int
    goal: str
    functions: tuple[str, ...]  # in the order the engine first calls them
    formula: str  # the bytes a correct engine holds and sends, per rank (P: padded parameters, N: ranks)
    hints: tuple[str, ...]
    lesson: str  # the course's lesson that explains it (docs/learn/)


LABS = (
    Lab("zero1", "ZeRO-1: partition the Adam states, all-gather the parameters after the step", 1,
        "Each rank updates only its partition of the parameters, so it holds only its partition of Adam's "
        "states; after the step every rank gathers the others' updated partitions.",
        ("partition_bounds", "reduce_scatter_gradients", "all_gather_parameters"),
        "optimizer states 2 x 4 B x P / N; parameters 4 B x P; gradients 4 B x numel after backward. "
        "Wire per step: reduce-scatter (N-1)/N x 4 B x P, all-gather (N-1)/N x 4 B x P, and the 4 B "
        "all-reduce of the gradient norm the engine makes",
        ("A reduce-scatter sums: divide the partition by the world size, or every gradient is N times too large.",
         "Rank r owns [r x P/N, (r+1) x P/N); Adam's states take the size of what partition_bounds returns.",
         "all_gather_into_tensor(flat, partition) fills the whole buffer from every rank's partition: "
         "an all-reduce of the whole buffer moves twice the bytes."),
        "docs/learn/2-zero-1.md"),
    Lab("zero2", "ZeRO-2: reduce-scatter the gradients into partitions during backward, in buckets", 2,
        "As backward produces each gradient it goes into a bucket; a full bucket is reduce-scattered, so each "
        "rank keeps only its gradient partition, never the full gradients.",
        ("partition_bounds", "reduce_scatter_gradients", "all_gather_parameters", "gradient_ready"),
        "after backward: gradient partition 4 B x P / N and no full gradients; optimizer states 2 x 4 B x P / N. "
        "Wire per step: as ZeRO-1 (reduce-scatter and all-gather, (N-1)/N x 4 B x P each)",
        ("Release parameter.grad as soon as it is in the bucket: ZeRO-2 holds no full gradients after backward.",
         "Reduce-scatter the bucket (not all-reduce it): each rank needs only its partition's sums.",
         "Release the bucket once its partition is taken."),
        "docs/learn/3-zero-2.md"),
)

BY_NAME = {lab.name: lab for lab in LABS}


def lab_named(name: str) -> Lab | None:
    return BY_NAME.get(name)
