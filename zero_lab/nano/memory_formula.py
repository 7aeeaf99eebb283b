"""Bytes each rank holds for model states, per ZeRO stage and precision: nano's documented formula.

The engine's tests measure the tensors nano really holds and compare them with this table, and
`zero-lab estimate` prints it beside the ZeRO paper's figures and official DeepSpeed's estimators.

Phase 1: pad the parameter count to a multiple of the partition count (the world size; 1 at
         stage 0). Partitions may cut through parameters, so only the total matters.
Phase 2: split it into `world_size` partitions (stage 0 keeps one partition: the whole buffer).
Phase 3: count every buffer of the vocabulary in `zero_lab.nano` at its dtype width.
"""

from __future__ import annotations

PARAMETER_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}
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


def padded_numel(numel: int, world_size: int) -> int:
    """The flat parameter buffer's length: numel rounded up to a multiple of world_size."""
    return -(-numel // world_size) * world_size


def partition_count(stage: int, world_size: int) -> int:
    """Stage 0 keeps the whole buffer as one partition; stages 1 and 2 cut it in world_size."""
    return 1 if stage == 0 else world_size


def partition_numel(stage: int, numel: int, world_size: int) -> int:
    """Elements in this rank's partition."""
    count = partition_count(stage, world_size)
    return padded_numel(numel, count) // count


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
    if stage not in (0, 1, 2):
        raise ValueError(f"nano implements ZeRO stages 0, 1 and 2, not {stage}")
    if precision not in PARAMETER_BYTES:
        raise ValueError(f"precision must be one of {sorted(PARAMETER_BYTES)}, not {precision!r}")
    if moment not in MOMENTS:
        raise ValueError(f"moment must be one of {MOMENTS}, not {moment!r}")
    width = PARAMETER_BYTES[precision]
    padded = padded_numel(numel, partition_count(stage, world_size))
    partition = partition_numel(stage, numel, world_size)
    holds_full_gradients = moment == "backward" and stage in (0, 1)
    holds_gradient_partition = moment == "step" or (moment == "backward" and stage == 2)
    return {
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
