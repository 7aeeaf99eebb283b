"""The header lines of the log contract (`[zero]`, `[model]`) and the one way rank 0 prints a line,
shared by the built-in workload (`harness/train.py`) and the hook that makes a user's script
print the same lines (`zero_lab.clients.contract`). Fields: docs/log-format.md.
"""

from __future__ import annotations

import math
import os
import sys

import torch

from zero_lab.workload.engines.impls import loss_scale, optimizer_name
from zero_lab.workload.log_contract.log_lines import MB, format_line
from zero_lab.workload.meters.model_flops import device_name, flops_per_token


def emit(rank: int, tag: str, fields: dict, step: int | None = None) -> None:
    """A contract line from rank 0, written whole and flushed so no other output splits it."""
    if rank == 0:
        sys.stdout.write(format_line(tag, fields, step) + "\n")
        sys.stdout.flush()


def announce_rank(rank: int, world_size: int) -> None:
    """The `[rank]` line, the only one every rank prints: on a node without global rank 0
    (multi-node) the CLI learns the world size and where the `[opt_step]` lines are."""
    sys.stdout.write(format_line("rank", {"global_rank": rank, "world_size": world_size,
                                          "local_rank": int(os.environ.get("LOCAL_RANK", 0))}) + "\n")
    sys.stdout.flush()


def zero_header(impl: str, stage: int, world_size: int, settings, accumulation: int) -> dict:
    """The `[zero]` line: the ZeRO settings both impls run with (stage-3 keys at stage 3);
    settings None (a config nano's reader cannot read): the engine's own figures only."""
    fields = {"impl": impl, "stage": stage, "world_size": world_size}
    if settings is None:
        return {**fields, "gradient_accumulation_steps": accumulation}
    zero = settings.zero_optimization
    fields.update({"reduce_scatter": zero.reduce_scatter, "reduce_bucket_size": zero.reduce_bucket_size,
                   "allgather_bucket_size": zero.allgather_bucket_size, "overlap_comm": zero.overlap_comm,
                   "communication_data_type": settings.communication_data_type or "auto",
                   "gradient_accumulation_steps": accumulation,
                   "offload_optimizer": zero.offload_optimizer.device, "offload_param": zero.offload_param.device})
    if stage == 3:
        fields.update({key: getattr(zero, key) for key in (
            "stage3_param_persistence_threshold", "stage3_prefetch_bucket_size", "stage3_max_live_parameters",
            "stage3_max_reuse_distance")})
    return fields


def parameter_count(module: torch.nn.Module) -> int:
    """Every parameter's elements, also where official stage 3 left a parameter empty (ds_numel)."""
    return sum(getattr(parameter, "ds_numel", parameter.numel()) for parameter in module.parameters())


def model_header(name: str, engine, precision: str, device: torch.device, seq_len: int, micro_batch: int,
                 gradient_checkpointing: bool, formula: dict | None, startup_peak: int | None = None,
                 resident_beside: int | None = None) -> dict:
    """The `[model]` line of an engine's module; formula: nano's model-state bytes per place
    (`state_formula.peak_bytes`), None when it could not be computed (nan in the line); startup_peak:
    this rank's peak live bytes from before the model was built until now; resident_beside: what the
    process holds resident beside its live tensors now, on a CPU (each omitted when None)."""
    parameter = next(engine.module.parameters())
    config = getattr(engine.module, "config", None)
    return {
        "name": name, "params": parameter_count(engine.module),
        "param_dtype": parameter.dtype, "compute_dtype": getattr(engine, "compute_dtype", parameter.dtype),
        "ds_precision": precision, "device": device.type, "device_name": device_name(device),
        "seq_len": seq_len, "micro_batch": micro_batch, "flops_per_token": flops_per_token(engine.module, seq_len),
        "attn_impl": getattr(config, "_attn_implementation", None) or "unknown",
        "gradient_checkpointing": gradient_checkpointing, "optimizer": optimizer_name(engine),
        "states_formula_mb": formula["device"] / MB if formula else float("nan"),
        "states_formula_host_mb": formula["host"] / MB if formula else float("nan"),
        **({"startup_peak_bytes": startup_peak} if startup_peak is not None else {}),
        **({"rss_beside_tensors_mb": resident_beside / MB} if resident_beside is not None else {})}


def states_by_place(breakdown) -> dict:
    """nano's own count of its model states after the step, per place (`engine.memory_breakdown`):
    what offload moved to the host, beside what stayed on the device. None (official): nothing."""
    if breakdown is None:
        return {}
    places = breakdown(by_device=True)
    return {f"states_{place}_mb": places.get(place, {}).get("total", 0) / MB for place in ("device", "host")}


def opt_step_fields(engine, measured: dict, breakdown, update_lr: float, update_applied: bool) -> dict:
    """The `[opt_step k]` line: the loss and the step's measured figures (`StepMetrics.end`) with
    what the engine knows after its step (grad_norm, lr, loss_scale), the update the step made
    (update_lr: the learning rate read just before its `engine.step()`; update_applied: false when
    the engine skipped it) and nano's states by place."""
    grad_norm = engine.get_global_grad_norm()
    measured = dict(measured)
    return {"loss": measured.pop("loss"), "grad_norm": float(grad_norm) if grad_norm is not None else math.nan,
            "lr": float(engine.get_lr()[0]), "loss_scale": loss_scale(engine), **measured,
            **states_by_place(breakdown), "update_lr": float(update_lr), "update_applied": update_applied}
