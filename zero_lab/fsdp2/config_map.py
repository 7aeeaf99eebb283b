"""One DeepSpeed JSON config, mapped onto FSDP2 (`torch.distributed.fsdp.fully_shard`).

Pure data, no torch: the CLI prints the mapping (`zero-lab config fsdp2 FILE`) at start-up speed,
and the engine (`zero_lab.fsdp2.engine`) turns the plan into torch objects.

Phase 1: nano's typed reader loads the config (DeepSpeed's defaults filled in, bad values refused
         with nano's one-line errors), so all three impls read the same numbers.
Phase 2: what has no FSDP2 equivalent is refused in one line (`Fsdp2ConfigError`): stages 0 and 1
         (FSDP2 shards parameters, gradients and optimizer states together), fp16 (DeepSpeed's
         loss scaling has no counterpart here), a gradient SUM over ranks.
Phase 3: the rest becomes an `Fsdp2Plan`:
           stage 3 -> reshard_after_forward=True, stage 2 -> reshard_after_forward=False;
           bf16 -> MixedPrecisionPolicy(param_dtype=bfloat16, reduce_dtype=communication_data_type
                   or bfloat16); fp32: no policy (fp32 everywhere);
           offload_optimizer / offload_param to cpu -> CPUOffloadPolicy(pin_memory=...);
           gradient_accumulation_steps -> set_requires_gradient_sync(False) on all micro-steps of
                   a window but the last (the loss divided by the steps, as DeepSpeed's backward);
           gradient_clipping -> the global norm of the sharded gradients, clipped as clip_grad_norm_;
           optimizer -> torch.optim.AdamW (Adam with adam_w_mode false) with the same lr, betas,
                   eps, weight_decay, its fused implementation chosen (not left to torch, whose
                   default differs between CPU and CUDA tensors: memory_formula);
                   scheduler -> DeepSpeed's schedule (nano's lr_schedules),
                   the same value step by step.
Phase 4: every key the file sets is one `MappingRow`: its FSDP2 equivalent, or "not applicable"
         with the reason; the harness logs the not-applicable ones as one `[warn]` line.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from zero_lab.nano.config import NanoConfig, load_config
from zero_lab.nano.errors import NanoConfigError

DTYPE_OF_PRECISION = {"bf16": "bfloat16", "fp32": "float32", "fp16": "float16"}

# Keys a config may set whose FSDP2 counterpart is not a setting at all, with the reason.
NOT_APPLICABLE = {
    "reduce_bucket_size": "FSDP2 reduce-scatters one fully_shard unit (a decoder block) per collective",
    "allgather_bucket_size": "FSDP2 all-gathers one fully_shard unit (a decoder block) per collective",
    "overlap_comm": "FSDP2 overlaps through its own CUDA streams (nothing to overlap on CPU)",
    "reduce_scatter": "FSDP2 always reduce-scatters gradients",
    "contiguous_gradients": "FSDP2 always packs a unit's gradients into one reduce-scatter input",
    "allgather_partitions": "FSDP2 always all-gathers whole units",
    "ignore_unused_parameters": "FSDP2 reduce-scatters zeros for a parameter without a gradient",
    "stage3_prefetch_bucket_size": "FSDP2 prefetches the next unit (implicit prefetching)",
    "stage3_max_live_parameters": "FSDP2 frees each unit at reshard; the live set is one or two units",
    "stage3_max_reuse_distance": "FSDP2 frees each unit at reshard; the live set is one or two units",
    "stage3_param_persistence_threshold": "FSDP2 shards every parameter of a unit, small or not",
    "stage3_gather_16bit_weights_on_model_save": "fsdp2 saves its fp32 shards with DCP (fsdp2/checkpoint.py)",
    "sub_group_size": "the optimizer steps every local shard in one torch.optim step",
    "leaf_module": "units are the decoder blocks fully_shard is applied to",
    "steps_per_print": "the harness prints every step",
    "check_grad_overflow": "torch.optim steps whatever the gradients hold (no skipped steps)",
    "immediate_grad_update": "FSDP2 reduces each unit's gradients when its backward ends",
    "torch_adam": "fsdp2 always steps with torch.optim",
    "grad_accum_dtype": "FSDP2 accumulates unsharded gradients in param_dtype within a window",
    "zero_allow_untested_optimizer": "fsdp2 builds its own torch.optim optimizer",
    "zero_force_ds_cpu_optimizer": "fsdp2 builds its own torch.optim optimizer",
}


class Fsdp2ConfigError(NanoConfigError):
    """A config FSDP2 cannot run as written; the message names the key and the fix in one line."""


@dataclass(frozen=True)
class MappingRow:
    key: str  # the DeepSpeed key as the file writes it, dotted
    value: Any  # its value in the file
    fsdp2: str  # the FSDP2 equivalent, or "not applicable: <why>"

    @property
    def applicable(self) -> bool:
        return not self.fsdp2.startswith("not applicable")


@dataclass(frozen=True)
class Fsdp2Plan:
    """What the engine builds: fully_shard's arguments, the optimizer, the step's rules."""

    stage: int  # 2 or 3, as the [zero] line reports it
    reshard_after_forward: bool  # fully_shard(reshard_after_forward=...)
    param_dtype: Optional[str]  # MixedPrecisionPolicy(param_dtype=...); None: fp32 throughout
    reduce_dtype: Optional[str]  # MixedPrecisionPolicy(reduce_dtype=...)
    cpu_offload: bool  # CPUOffloadPolicy instead of OffloadPolicy()
    pin_memory: bool  # CPUOffloadPolicy(pin_memory=...)
    gradient_accumulation_steps: int  # micro-steps per optimizer step
    gradient_clipping: float  # max global gradient norm; 0: no clipping
    optimizer: str  # "AdamW" or "Adam" (torch.optim's class), or "Muon" (`muon.py`: torch's Muon and AdamW)
    optimizer_params: dict  # lr, betas, eps, weight_decay; fused=True (memory_formula.step_temporary_bytes)
    scheduler: Optional[tuple[str, dict]]  # DeepSpeed schedule name and its params
    precision: str  # "fp32" or "bf16", the run's DeepSpeed precision
    rows: tuple[MappingRow, ...] = field(default=())  # every key the file set (Phase 4)

    @property
    def not_applicable(self) -> list[MappingRow]:
        return [row for row in self.rows if not row.applicable]


def _refuse(settings: NanoConfig) -> None:
    """Phase 2."""
    stage = settings.zero_optimization.stage
    if stage not in (2, 3):
        raise Fsdp2ConfigError(f"zero_optimization.stage {stage} has no FSDP2 equivalent (fully_shard shards "
                               "parameters, gradients and optimizer states together); use stage 2 "
                               "(reshard_after_forward=False) or 3 (True) for fsdp2")
    if settings.precision == "fp16":
        raise Fsdp2ConfigError("fp16 has no FSDP2 equivalent in zero-lab (DeepSpeed's loss scaling is not mapped); "
                               "use bf16 (MixedPrecisionPolicy) or fp32")
    if settings.gradient_allreduce_op != "mean":
        raise Fsdp2ConfigError("gradient_allreduce_op \"sum\" has no FSDP2 equivalent (FSDP2 averages gradients "
                               "over ranks); remove the key")
    if settings.optimizer is None:
        raise Fsdp2ConfigError('the config has no "optimizer" section; add {"optimizer": {"type": "AdamW", '
                               '"params": {"lr": 1e-4}}}')


def _leaves(node: Any, prefix: str = "") -> list[tuple[str, Any]]:
    if isinstance(node, dict) and node and not prefix.endswith("scheduler.params"):
        return [leaf for key, value in node.items() for leaf in _leaves(value, f"{prefix}.{key}" if prefix else key)]
    return [(prefix, node)]


def _equivalent(key: str, plan: Fsdp2Plan) -> str:
    """Phase 4: the FSDP2 counterpart of one dotted key."""
    last = key.rsplit(".", 1)[-1]
    if key == "zero_optimization.stage":
        return f"fully_shard(reshard_after_forward={plan.reshard_after_forward})"
    if key in ("bf16.enabled", "bfloat16.enabled", "fp16.enabled"):
        return (f"MixedPrecisionPolicy(param_dtype={plan.param_dtype}, reduce_dtype={plan.reduce_dtype})"
                if plan.param_dtype else "no MixedPrecisionPolicy (fp32 throughout)")
    if key == "communication_data_type":
        return f"MixedPrecisionPolicy(reduce_dtype={plan.reduce_dtype})"
    if key.startswith("zero_optimization.offload_"):
        if last in ("device", "pin_memory"):
            return (f"CPUOffloadPolicy(pin_memory={plan.pin_memory})" if plan.cpu_offload
                    else "OffloadPolicy() (no offload)")
        return "not applicable: CPUOffloadPolicy has no NVMe or buffer settings"
    if key == "gradient_accumulation_steps":
        return (f"set_requires_gradient_sync(False) on {plan.gradient_accumulation_steps - 1} of "
                f"{plan.gradient_accumulation_steps} micro-steps; loss / {plan.gradient_accumulation_steps}")
    if key == "gradient_clipping":
        return (f"clip_grad_norm_(max_norm={plan.gradient_clipping:g}) on the sharded gradients"
                if plan.gradient_clipping > 0 else "no clipping")
    if key.startswith("optimizer."):
        return f"torch.optim.{plan.optimizer}({', '.join(f'{k}={v}' for k, v in plan.optimizer_params.items())})"
    if key.startswith("scheduler."):
        return f"{plan.scheduler[0]}'s value each step, set on torch.optim's param groups"
    if key in ("train_micro_batch_size_per_gpu", "train_batch_size"):
        return "the same batches per rank (the harness's data)"
    if last in NOT_APPLICABLE:
        return f"not applicable: {NOT_APPLICABLE[last]}"
    return "not applicable: no FSDP2 counterpart"


def map_config(config: dict, world_size: int = 1) -> Fsdp2Plan:
    """Phases 1-4 for a DeepSpeed config dict and the run's world size."""
    settings = load_config(dict(config), world_size=world_size)  # Phase 1
    _refuse(settings)  # Phase 2
    zero = settings.zero_optimization
    precision = settings.precision
    param_dtype = DTYPE_OF_PRECISION[precision] if precision != "fp32" else None
    reduce_dtype = (DTYPE_OF_PRECISION[settings.communication_data_type] if settings.communication_data_type
                    else param_dtype)
    offloads = [section for section in (zero.offload_optimizer, zero.offload_param) if section.device == "cpu"]
    adam = settings.optimizer.params
    plan = Fsdp2Plan(  # Phase 3
        stage=zero.stage, reshard_after_forward=zero.stage == 3, param_dtype=param_dtype,
        reduce_dtype=reduce_dtype, cpu_offload=bool(offloads),
        pin_memory=any(section.pin_memory for section in offloads),
        gradient_accumulation_steps=settings.gradient_accumulation_steps,
        gradient_clipping=settings.gradient_clipping,
        optimizer="Muon" if settings.optimizer.type == "Muon" else "AdamW" if adam.adam_w_mode else "Adam",
        optimizer_params={"muon_params": adam} if settings.optimizer.type == "Muon" else {
            "lr": adam.lr, "betas": tuple(adam.betas), "eps": adam.eps, "weight_decay": adam.weight_decay,
            "fused": True},
        scheduler=(settings.scheduler.type, dict(settings.scheduler.params)) if settings.scheduler else None,
        precision=precision)
    rows = tuple(MappingRow(key, value, _equivalent(key, plan)) for key, value in _leaves(config))  # Phase 4
    return Fsdp2Plan(**{**plan.__dict__, "rows": rows})


def not_applicable_message(plan: Fsdp2Plan) -> Optional[str]:
    """The one `[warn]` message naming the keys FSDP2 has no use for; None when there are none."""
    keys = [row.key for row in plan.not_applicable]
    if not keys:
        return None
    return f"config keys {', '.join(keys)} are not applicable to FSDP2 (zero-lab config fsdp2 FILE says why)"
