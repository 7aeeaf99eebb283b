"""FSDP2's model-state bytes per rank, from parameter shapes alone (no torch import needed to
call `layout_bytes`; `peak_bytes` reads the shapes off a model, meta or real).

FSDP2's layout (torch 2.13, `FSDPParam._init_sharded_param`): each parameter is cut along dim 0
into world_size chunks of ceil(d0 / world_size) rows (`torch.chunk`; the last ranks may get fewer
rows or none). Per rank and parameter:
    sharded parameter: the chunk padded to the first chunk's size, always fp32 (4 bytes per
        element; MixedPrecisionPolicy casts the all-gather input, never the stored shard);
    exp_avg, exp_avg_sq: shaped like the rank's unpadded chunk, fp32 (8 bytes per element);
    step: one fp32 scalar per parameter, beside the parameter (torch.optim's state["step"] is on
        the parameter's device when the optimizer is fused, as zero_lab.fsdp2 asks for);
    sharded gradient (after the backward, freed by zero_grad): one fp32 element per padded element.
Per rank, once: the device mesh's rank map, one int32 per rank (`DeviceMesh._rank_map`), on the
host. So on CUDA the device holds all but the rank map.
While it steps, torch.optim's Adam holds temporaries that depend on its implementation
(`step_temporary_bytes`): the fused one, which zero_lab.fsdp2 chooses, holds none.
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


def layout_bytes(shapes: Iterable[tuple[int, ...]], world_size: int, rank: int = 0,
                 muon_flags: list[bool] | None = None) -> dict[str, int]:
    """Bytes per role on one rank for parameters of these shapes: parameters, gradients, states.
    With Muon (`muon.py`), a parameter flagged in `muon_flags` holds torch.optim.Muon's momentum
    (fp32, like its chunk) instead of Adam's two states and step."""
    parameters = gradients = states = 0
    shapes = list(shapes)
    for shape, muon in zip(shapes, muon_flags or [False] * len(shapes)):
        rows, rest = (shape[0], math.prod(shape[1:])) if shape else (1, 1)
        held, padded = chunk_rows(rows, world_size, rank)
        parameters += FP32 * padded * rest
        gradients += FP32 * padded * rest
        states += FP32 * held * rest if muon else 2 * FP32 * held * rest + FP32  # Muon: its momentum, no step
    return {"parameters": parameters, "gradients": gradients, "optimizer_states": states,
            "device_mesh": INT32 * world_size}


def moment_bytes(shapes: Iterable[tuple[int, ...]], world_size: int, moment: str, rank: int = 0,
                 muon_flags: list[bool] | None = None) -> int:
    """Model-state bytes at a moment: "between_steps" or "backward" (see the module docstring)."""
    roles = layout_bytes(list(shapes), world_size, rank, muon_flags)
    between = roles["parameters"] + roles["optimizer_states"] + roles["device_mesh"]
    return between if moment == "between_steps" else between + roles["gradients"]


# torch.optim's Adam implementations (torch 2.x, `optim/adam.py`), and what each holds beyond the
# states while it steps. zero_lab.fsdp2 asks for "fused" (`fused=True`); left to itself torch picks
# "foreach" for CUDA tensors and "for-loop" for CPU ones, so a CPU run would never show what a GPU
# run holds.
#   fused:    `torch._fused_adamw_`, one kernel per parameter group: nothing;
#   foreach:  `_multi_tensor_adam`: `torch._foreach_sqrt(exp_avg_sqs)`, one fp32 copy of every
#             exp_avg_sq of a parameter group at once (4 bytes per local element);
#   for-loop: `_single_tensor_adam`, a parameter at a time: `exp_avg_sq.sqrt()` and its quotient by
#             the bias correction, two fp32 copies of one parameter's states at once.
ADAM_IMPLEMENTATIONS = ("fused", "foreach", "for-loop")


def step_temporary_bytes(groups: Iterable[Iterable[tuple[int, ...]]], world_size: int, implementation: str,
                         rank: int = 0) -> int:
    """The most bytes torch.optim's Adam holds beyond its states during a step on one rank, for
    parameter groups of these shapes (the comment above ADAM_IMPLEMENTATIONS says why)."""
    if implementation not in ADAM_IMPLEMENTATIONS:
        raise ValueError(f"implementation must be one of {ADAM_IMPLEMENTATIONS}, not {implementation!r}")
    if implementation == "fused":
        return 0
    held = [[chunk_rows(shape[0] if shape else 1, world_size, rank)[0] * math.prod(shape[1:]) for shape in group]
            for group in groups]
    if implementation == "foreach":
        return max((FP32 * sum(group) for group in held), default=0)
    return max((2 * FP32 * numel for group in held for numel in group), default=0)


def peak_bytes(model, settings, world_size: int, device_type: str = "cpu") -> dict[str, int]:
    """{"device": bytes, "host": bytes} of rank 0 at its peak moment (the backward; the fused
    optimizer's step adds nothing to it), as the harness's `[model]` line reports every impl's
    formula; CPU offload puts it all on the host, and on an accelerator the mesh's rank map is on
    the host too."""
    named = [(name, tuple(parameter.shape)) for name, parameter in model.named_parameters() if parameter.requires_grad]
    shapes = [shape for _, shape in named]
    muon = None
    if settings.optimizer is not None and settings.optimizer.type == "Muon":
        from zero_lab.nano.muon.groups import is_hidden_matrix

        muon = [is_hidden_matrix(name, shape) for name, shape in named]
    total = moment_bytes(shapes, world_size, "backward", muon_flags=muon)
    zero = settings.zero_optimization
    offloaded = zero.offload_optimizer.device == "cpu" or zero.offload_param.device == "cpu"
    if offloaded or device_type == "cpu":
        return {"device": 0, "host": total} if offloaded else {"device": total, "host": 0}
    host = INT32 * world_size
    return {"device": total - host, "host": host}
