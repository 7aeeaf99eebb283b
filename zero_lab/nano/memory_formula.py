"""Bytes each rank holds for model states, per ZeRO stage and precision: nano's documented formula.

The engine's tests measure the tensors nano really holds and compare them with this table, and
`zero-lab estimate` prints it beside the ZeRO paper's figures and official DeepSpeed's estimators.

Phase 1: pad the parameter count to a multiple of the partition count (world size; 1 at stage 0) (partitions may cut through
         parameters, so only the total matters: `padded_numel`).
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


def model_state_bytes(stage: int, precision: str, numel: int, world_size: int,
                      between_steps: bool = False) -> dict[str, int]:
    """Bytes per rank for each buffer category while the optimizer steps (the ZeRO paper's model
    states), or `between_steps`, when nano has released every gradient buffer. Communication
    buckets are excluded: they live only while a bucket is being reduced.

    fp32: the partition of the flat parameter buffer is the master, so there is no master copy, and
    at stages 0 and 1 the rank's slice of the full gradient buffer is its gradient partition.
    bf16/fp16: 2-byte parameters (and, at stages 0/1, 2-byte full gradients) plus fp32 master,
    gradient and optimizer-state partitions.
    """
    if stage not in (0, 1, 2):
        raise ValueError(f"nano implements ZeRO stages 0, 1 and 2, not {stage}")
    if precision not in PARAMETER_BYTES:
        raise ValueError(f"precision must be one of {sorted(PARAMETER_BYTES)}, not {precision!r}")
    width = PARAMETER_BYTES[precision]
    padded = padded_numel(numel, partition_count(stage, world_size))
    partition = partition_numel(stage, numel, world_size)
    full_gradients = padded * width if stage in (0, 1) and not between_steps else 0
    mixed = precision != "fp32"
    separate_gradient_partition = (mixed or stage == 2) and not between_steps
    return {
        "parameters": padded * width,
        "gradients": full_gradients,
        "fp32_master_partition": partition * FP32_BYTES if mixed else 0,
        "optimizer_states": partition * FP32_BYTES * ADAM_STATE_COUNT,
        "gradient_partition": partition * FP32_BYTES if separate_gradient_partition else 0,
        "communication_buckets": 0,
    }


def bytes_per_parameter(stage: int, precision: str, world_size: int, numel: int = 10**9,
                        between_steps: bool = False) -> float:
    """Total model-state bytes per parameter per rank (for large models, where padding vanishes)."""
    return sum(model_state_bytes(stage, precision, numel, world_size, between_steps).values()) / numel
