"""Model-state bytes per rank: the ZeRO paper's formulas, nano's formula, official DeepSpeed's code.

Model states are parameters, gradients and optimizer states (activations and buffers excluded).
With P parameters, N ranks and Adam (K bytes of optimizer state per parameter):

| stage | ZeRO paper (mixed precision, K = 12)  | here for fp32 (K = 8: no master copy) |
|-------|---------------------------------------|---------------------------------------|
| 0     | 2P + 2P + 12P                         | 4P + 4P + 8P                          |
| 1     | 2P + 2P + 12P/N                       | 4P + 4P + 8P/N                        |
| 2     | 2P + (2 + 12)P/N                      | 4P + (4 + 8)P/N                       |
| 3     | (2 + 2 + 12)P/N                       | (4 + 4 + 8)P/N                        |

Official DeepSpeed's estimators assume 16-bit training: stage 2 is `2P + 18P/N` in code (it
counts 2-byte and 4-byte gradients in the 18, where its docs say 16), stage 3 is
`4 * largest_layer + 18P/N`, and it has none for stages 0 and 1. With the optimizer offloaded,
stage 2 keeps 2P on the device and stage 3 `4 * largest_layer + 2P/N`; with the parameters too,
stage 3 keeps `4 * largest_layer`. Its host figures are per node, with a 1.5 buffer factor.
nano's figures come from its own formula (`zero_lab.nano.memory.memory_formula`), per place; at stage 3
from the model's own flat buffers (its units), so an estimate of a bare parameter count has none.
"""

from __future__ import annotations

from zero_lab.nano import stages
from zero_lab.nano.memory.memory_formula import peak_model_state_bytes_by_place

PRECISIONS = ("fp32", "bf16", "fp16")
MIB = 2**20


def paper_bytes(stage: int, precision: str, numel: int, world_size: int) -> int:
    """The ZeRO paper's model-state bytes per rank (fp32: no separate master copy)."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, not {precision!r}")
    width = 4 if precision == "fp32" else 2
    optimizer = 8 if precision == "fp32" else 12
    parameters, gradients, states = width * numel, width * numel, optimizer * numel
    shard = {0: (), 1: ("states",), 2: ("states", "gradients"), 3: ("states", "gradients", "parameters")}
    if stage not in shard:
        raise ValueError(f"the ZeRO paper defines stages 0 to 3, not {stage}")
    sizes = {"parameters": parameters, "gradients": gradients, "states": states}
    return int(sum(size / world_size if name in shard[stage] else size for name, size in sizes.items()))


OFFLOADS = ("none", "optimizer", "param")  # the harness's --offload: param offloads the optimizer too


def official_bytes(stage: int, numel: int, world_size: int, largest_layer: int | None,
                   offload: str = "none") -> dict[str, int] | None:
    """Official DeepSpeed's own estimator, {"device": bytes per GPU, "host": bytes per node}
    (16-bit training, one node of `world_size` GPUs), or None where it has none.

    Calls the functions in the installed package, so the figures are DeepSpeed's, not our copy.
    Its host figure is per node, and without offload it is the fp32 model each process loads.
    """
    if stage == 2 and offload != "param":
        from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs

        host, device = estimate_zero2_model_states_mem_needs(
            numel, num_gpus_per_node=world_size, cpu_offload=offload == "optimizer")
        return {"device": device, "host": host}
    if stage == 3 and largest_layer is not None:
        from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs

        host, device, _ = estimate_zero3_model_states_mem_needs(
            numel, largest_layer, num_gpus_per_node=world_size, cpu_offload=offload != "none",
            cpu_offload_params=offload == "param")
        return {"device": device, "host": host}
    return None


def nano_bytes(stage: int, precision: str, numel: int, world_size: int,
               stage3_buffers: list[tuple[int, str]] | None = None, offload: str = "none") -> dict[str, int] | None:
    """nano's documented peak model-state bytes per rank, {"device": ..., "host": ...}; None where
    nano has no figure: a stage it does not implement, stage 3 without the model's buffers (its
    units decide what is gathered), or an offload the stage does not take."""
    if stages.refusal(stage) or (stage == 3 and not stage3_buffers):
        return None
    if (offload == "optimizer" and stage == 0) or (offload == "param" and stage != 3):
        return None
    return peak_model_state_bytes_by_place(stage, precision, numel, world_size, stage3_buffers,
                                           offload_optimizer=offload != "none", offload_parameters=offload == "param")


def megabytes(figures: dict[str, int] | None, place: str) -> float | None:
    return None if figures is None else figures[place] / MIB


def estimate_rows(
    numel: int,
    world_sizes: list[int],
    stages: list[int],
    precision: str,
    largest_layer: int | None = None,
    with_official: bool = True,
    stage3_buffers: list[tuple[int, str]] | None = None,
    offload: str = "none",
) -> list[dict[str, object]]:
    """One row per (world size, stage): the three estimates in MiB (nano and official per place)."""
    rows = []
    for world_size in world_sizes:
        for stage in stages:
            official = official_bytes(stage, numel, world_size, largest_layer, offload) if with_official else None
            nano = nano_bytes(stage, precision, numel, world_size, stage3_buffers, offload)
            rows.append(
                {
                    "world_size": world_size,
                    "stage": stage,
                    "precision": precision,
                    "offload": offload,
                    "params": numel,
                    "paper_mb": paper_bytes(stage, precision, numel, world_size) / MIB,
                    "nano_mb": megabytes(nano, "device"),
                    "nano_host_mb": megabytes(nano, "host"),
                    "official_estimator_mb": megabytes(official, "device"),
                    "official_estimator_host_mb_per_node": megabytes(official, "host"),
                }
            )
    return rows


def parse_param_count(text: str) -> int | None:
    """'600M', '1.5B', '7e9', '124000' -> a parameter count; None when it is not a count."""
    suffixes = {"K": 10**3, "M": 10**6, "B": 10**9, "G": 10**9, "T": 10**12}
    scale = suffixes.get(text[-1:].upper(), 1)
    number = text[:-1] if scale != 1 else text
    try:
        value = float(number) * scale
    except ValueError:
        return None
    return int(value) if value >= 1 else None


def muon_nano_bytes(buffers: list, stage: int, precision: str, world_size: int) -> dict[str, int] | None:
    """nano's peak model-state bytes per rank with Muon, from explain's flat buffers of the model
    (`explain.flat_buffers`: the Muon and AdamW halves, each laid out as the engine lays it out): a
    Muon buffer holds the momentum of the matrices a rank's partition touches (the most any rank
    holds, `nano.muon.memory`) instead of Adam's two states. None for a stage nano does not run."""
    from zero_lab.nano.muon.memory import momentum_numel

    if stages.refusal(stage):
        return None
    partitioned = stages.of(stage).partitions_parameters  # stage 3 partitions the momentum too
    momentum = [max(momentum_numel(buffer.layout, rank, partitioned) for rank in range(world_size)) if buffer.muon
                else None for buffer in buffers]
    if stage == 3:
        roles = [(buffer.layout.numel, "persistent" if not buffer.sharded else "root" if buffer.unit == "root"
                  else "block") for buffer in buffers]
        return peak_model_state_bytes_by_place(3, precision, sum(numel for numel, _ in roles), world_size, roles,
                                               momentum_numels=momentum)
    figures = [peak_model_state_bytes_by_place(stage, precision, buffer.layout.numel, world_size,
                                               momentum_numels=[numel])
               for buffer, numel in zip(buffers, momentum)]
    return {place: sum(figure[place] for figure in figures) for place in ("device", "host")}
