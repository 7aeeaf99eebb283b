"""Bytes each rank holds for model states, per ZeRO stage and precision: nano's documented formula.

The engine's tests measure the tensors nano really holds and compare them with this table, and
`zero-lab estimate` prints it beside the ZeRO paper's figures and official DeepSpeed's estimators.

Phase 1: lay the group out as the engine does (`layout.FlatLayout`): padded as official DeepSpeed
         pads, split into `world_size` partitions (stage 0 keeps one: the whole buffer).
         Partitions may cut through parameters, so only the group's total matters.
Phase 2: count every buffer of the vocabulary in `zero_lab.nano` at its dtype width.
"""

from __future__ import annotations

from zero_lab.nano import stages
from zero_lab.nano.dtypes import BYTES_OF_PRECISION
from zero_lab.nano.layout import FlatLayout

FP32_BYTES = 4
ADAM_STATE_COUNT = 2  # exp_avg and exp_avg_sq, both fp32

CATEGORIES = (
    "parameters",
    "gradients",
    "fp32_master_partition",
    "optimizer_states",
    "gradient_partition",
    "communication_buckets",
)


MOMENTS = ("backward", "step", "between_steps")


def model_state_bytes(stage: int, precision: str, numel: int, world_size: int, moment: str = "step") -> dict[str, int]:
    """Bytes per rank for each buffer category at one moment of a training step:

    backward:      the window's backward is done. Stages 0/1 hold full-size `param.grad`
                   (the parameters' dtype); stage 2 holds its fp32 gradient partition instead.
    step:          Adam is running: every stage holds its fp32 gradient partition (full at stage 0)
                   and has released `param.grad`.
    between_steps: every gradient buffer is released; parameters, masters and states remain.
    fp32 needs no master copy: the flat buffer's partition is the master. Communication buckets
    are excluded: they live only while a bucket is being reduced.
    """
    refused = stages.refusal(stage)
    if refused:
        raise ValueError(refused)
    if precision not in BYTES_OF_PRECISION:
        raise ValueError(f"precision must be one of {sorted(BYTES_OF_PRECISION)}, not {precision!r}")
    if moment not in MOMENTS:
        raise ValueError(f"moment must be one of {MOMENTS}, not {moment!r}")
    width = BYTES_OF_PRECISION[precision]
    layout = FlatLayout.for_stage((numel,), stage, precision, world_size)  # Phase 1
    padded, partition = layout.padded_numel, layout.partition_numel
    holds_full_gradients = moment == "backward" and stage in (0, 1)
    holds_gradient_partition = moment == "step" or (moment == "backward" and stage == 2)
    return {  # Phase 2
        "parameters": padded * width,
        "gradients": numel * width if holds_full_gradients else 0,
        "fp32_master_partition": partition * FP32_BYTES if precision != "fp32" else 0,
        "optimizer_states": partition * FP32_BYTES * ADAM_STATE_COUNT,
        "gradient_partition": partition * FP32_BYTES if holds_gradient_partition else 0,
        "communication_buckets": 0,
    }


def peak_model_state_bytes(stage: int, precision: str, numel: int, world_size: int) -> int:
    """The larger of the backward and step moments: what a rank must fit besides activations."""
    return max(sum(model_state_bytes(stage, precision, numel, world_size, moment).values())
               for moment in ("backward", "step"))


def bytes_per_parameter(stage: int, precision: str, world_size: int, numel: int = 10**9) -> float:
    """Peak model-state bytes per parameter per rank (for large models, where padding vanishes)."""
    return peak_model_state_bytes(stage, precision, numel, world_size) / numel
