"""FSDP2's model-state bytes per rank, from parameter shapes alone (no torch import needed to
call `layout_bytes`; `peak_bytes` reads the shapes off a model, meta or real).

FSDP2's layout (torch 2.13, `FSDPParam._init_sharded_param`): each parameter is cut along dim 0
into world_size chunks of ceil(d0 / world_size) rows (`torch.chunk`; the last ranks may get fewer
rows or none). Per rank and parameter:
    sharded parameter: the chunk padded to the first chunk's size, always fp32 (4 bytes per
        element; MixedPrecisionPolicy casts the all-gather input, never the stored shard);
    exp_avg, exp_avg_sq: shaped like the rank's unpadded chunk, fp32 (8 bytes per element);
    step: one fp32 scalar per parameter, on the host whatever the device (torch.optim's
        state["step"] is a CPU tensor unless the optimizer is capturable or fused);
    sharded gradient (after the backward, freed by zero_grad): one fp32 element per padded element.
Per rank, once: the device mesh's rank map, one int32 per rank (`DeviceMesh._rank_map`), also
on the host. So on CUDA the device holds all but the step scalars and the rank map.
Moments (as nano's formula names them): "between_steps" = parameters + optimizer states;
"backward" = that plus the gradients, the largest model-state moment of a step. Rank 0 always
holds a full chunk, so its bytes are the maximum over ranks, the figure the harness logs.
With CPUOffloadPolicy every one of these lives on the host instead of the device.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

FP32 = 4
INT32 = 4


def chunk_rows(rows: int, world_size: int, rank: int) -> tuple[int, int]:
    """(rows this rank holds, rows its padded shard has) of a dim-0 size cut over world_size."""
    chunk = math.ceil(rows / world_size) if rows else 0
    return max(0, min(chunk, rows - rank * chunk)), chunk


def layout_bytes(shapes: Iterable[tuple[int, ...]], world_size: int, rank: int = 0) -> dict[str, int]:
    """Bytes per role on one rank for parameters of these shapes: parameters, gradients, states."""
    parameters = gradients = states = 0
    for shape in shapes:
        rows, rest = (shape[0], math.prod(shape[1:])) if shape else (1, 1)
        held, padded = chunk_rows(rows, world_size, rank)
        parameters += FP32 * padded * rest
        gradients += FP32 * padded * rest
        states += 2 * FP32 * held * rest + FP32
    return {"parameters": parameters, "gradients": gradients, "optimizer_states": states,
            "device_mesh": INT32 * world_size}


def moment_bytes(shapes: Iterable[tuple[int, ...]], world_size: int, moment: str, rank: int = 0) -> int:
    """Model-state bytes at a moment: "between_steps" or "backward" (see the module docstring)."""
    roles = layout_bytes(list(shapes), world_size, rank)
    between = roles["parameters"] + roles["optimizer_states"] + roles["device_mesh"]
    return between if moment == "between_steps" else between + roles["gradients"]


def peak_bytes(model, settings, world_size: int, device_type: str = "cpu") -> dict[str, int]:
    """{"device": bytes, "host": bytes} of rank 0 at its peak moment (the backward), as the
    harness's `[model]` line reports every impl's formula; CPU offload puts it all on the host, and
    on an accelerator the step scalars and the mesh's rank map are on the host too."""
    shapes = [tuple(parameter.shape) for parameter in model.parameters() if parameter.requires_grad]
    total = moment_bytes(shapes, world_size, "backward")
    zero = settings.zero_optimization
    offloaded = zero.offload_optimizer.device == "cpu" or zero.offload_param.device == "cpu"
    if offloaded or device_type == "cpu":
        return {"device": 0, "host": total} if offloaded else {"device": total, "host": 0}
    host = FP32 * len(shapes) + INT32 * world_size
    return {"device": total - host, "host": host}
