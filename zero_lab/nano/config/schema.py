"""The typed DeepSpeed config that nano honours, with DeepSpeed's own key names.

One pydantic model per section, one line of doc per field, DeepSpeed's defaults; rules that span
keys are model validators whose messages name the keys. `loading.py` reads a source into these
models.
"""

from __future__ import annotations

import math
import sys
from typing import Any, Literal, Optional, Union

from pydantic import (BaseModel, ConfigDict, Field, StrictBool, StrictInt, ValidationError, field_validator,
                      model_validator)

from zero_lab.nano import stages
from zero_lab.nano.stages import START_ALIGNMENT_FACTOR
from zero_lab.nano.config.zeropp import ZeroPlusPlusSettings

DEFAULT_BUCKET_SIZE = 500_000_000
TORCH_ADAMW_WEIGHT_DECAY = 0.01  # torch.optim.AdamW's default weight_decay


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class OptimizerParams(_Strict):
    lr: float = Field(1e-3, gt=0, description="Learning rate (a scheduler may override it).")
    betas: tuple[float, float] = Field((0.9, 0.999), description="Adam's (beta1, beta2).")
    eps: float = Field(1e-8, gt=0, description="Added to the denominator for stability.")
    weight_decay: float = Field(0.0, ge=0, description="Decoupled (AdamW) or L2 (Adam) decay; DeepSpeed's default is 0.")
    adam_w_mode: StrictBool = Field(True, description="True: AdamW's decoupled decay; False: Adam with L2 decay.")
    torch_adam: StrictBool = Field(False, description="Official DeepSpeed's switch to torch.optim (nano's math always "
                                   "equals torch's); without weight_decay, AdamW then decays by torch's default 0.01.")

    @model_validator(mode="after")
    def _torch_default_decay(self) -> "OptimizerParams":
        """Official DeepSpeed builds torch.optim.AdamW (Adam without adam_w_mode) from these params
        when torch_adam is true, so an unset weight_decay is torch's default: AdamW's 0.01, Adam's 0."""
        if self.torch_adam and "weight_decay" not in self.model_fields_set and self.adam_w_mode:
            self.weight_decay = TORCH_ADAMW_WEIGHT_DECAY
        return self


class MuonParams(_Strict):
    """Official DeepSpeed's Muon keys: Muon for the 2-D hidden weights, AdamW for the rest (`nano/muon/`).
    Each half takes the shared key unless its own (`muon_lr`, `adam_lr`) is set; unset, its own default."""

    lr: float = Field(0.02, gt=0, description="Both halves' learning rate, unless muon_lr/adam_lr (defaults 0.02/3e-4).")
    muon_lr: Optional[float] = Field(None, gt=0, description="The Muon half's learning rate.")
    adam_lr: Optional[float] = Field(None, gt=0, description="The AdamW half's learning rate.")
    momentum: float = Field(0.95, ge=0, lt=1, description="Muon's momentum (Nesterov).")
    ns_method: Literal["gram", "standard"] = Field("gram", description="Newton-Schulz on the Gram matrix, or on X.")
    betas: tuple[float, float] = Field((0.9, 0.95), description="The AdamW half's (beta1, beta2).")
    eps: float = Field(1e-10, gt=0, description="The AdamW half's epsilon.")
    weight_decay: float = Field(0.0, ge=0, description="Decoupled decay of both halves.")
    adam_w_mode: StrictBool = Field(True, description="The AdamW half decouples its decay (false: Adam with L2 decay).")
    torch_adam: StrictBool = Field(False, description="Official: torch.optim.AdamW for the AdamW half (nano's math).")


class OptimizerConfig(_Strict):
    type: Literal["Adam", "AdamW", "Muon"] = Field(description="Adam, AdamW or Muon (case-insensitive, as in DeepSpeed).")
    params: Union[OptimizerParams, MuonParams] = Field(default_factory=OptimizerParams, description="Hyper-parameters.")

    @field_validator("type", mode="before")
    @classmethod
    def _canonical_name(cls, name: Any) -> Any:
        if isinstance(name, str):
            return {"adam": "Adam", "adamw": "AdamW", "muon": "Muon"}.get(name.lower(), name)
        return name

    @model_validator(mode="before")
    @classmethod
    def _params_of_the_type(cls, data: Any) -> Any:
        """Muon's params are read as `MuonParams`, Adam's as `OptimizerParams` (each rejects the other's
        keys); a bad one is named by its whole path, as the loader names every field."""
        if not (isinstance(data, dict) and isinstance(data.get("type"), str)):
            return data
        model = MuonParams if data["type"].lower() == "muon" else OptimizerParams
        params = data.get("params", {})
        try:
            return {**data, "params": params if isinstance(params, BaseModel) else model.model_validate(params or {})}
        except ValidationError as error:
            first = error.errors()[0]
            where = ".".join(["optimizer", "params", *(str(part) for part in first["loc"])])
            if first["type"] == "extra_forbidden":
                raise ValueError(f"unknown config key '{where}'; check its spelling against DeepSpeed's docs") from None
            message = first["msg"].removeprefix("Value error, ")
            raise ValueError(f"config field '{where}': {message} (got {first.get('input')!r})") from None

    @property
    def decoupled_weight_decay(self) -> bool:
        """DeepSpeed: type AdamW always decouples; type Adam decouples unless adam_w_mode is false."""
        return self.type == "AdamW" or self.params.adam_w_mode

    @model_validator(mode="after")
    def _adamw_type_decays_as_torch(self) -> "OptimizerConfig":
        """Type AdamW with torch_adam is torch.optim.AdamW even when adam_w_mode is false."""
        params = self.params
        if (self.type == "AdamW" and params.torch_adam and not params.adam_w_mode
                and "weight_decay" not in params.model_fields_set):
            params.weight_decay = TORCH_ADAMW_WEIGHT_DECAY
        return self


class SchedulerConfig(_Strict):
    type: Literal["WarmupLR", "WarmupDecayLR", "WarmupCosineLR"] = Field(description="DeepSpeed scheduler name.")
    params: dict[str, Any] = Field(default_factory=dict, description="Keyword arguments; checked by the scheduler.")


class Fp16Config(_Strict):
    enabled: StrictBool = Field(False, description="fp16 parameters with dynamic (or static) loss scaling.")
    loss_scale: float = Field(0.0, ge=0, description="0 = dynamic loss scaling; > 0 = this static scale.")
    initial_scale_power: int = Field(16, ge=0, description="Dynamic scaling starts at 2**initial_scale_power.")
    loss_scale_window: int = Field(1000, ge=1, description="Overflow-free steps before the scale doubles.")
    hysteresis: int = Field(2, ge=1, description="Overflows tolerated before the scale is halved.")
    consecutive_hysteresis: StrictBool = Field(False, description="Refill hysteresis after each overflow-free step.")
    min_loss_scale: float = Field(1.0, gt=0, description="The scale never drops below this.")


class Bf16Config(_Strict):
    enabled: StrictBool = Field(False, description="bf16 parameters with fp32 master partitions; no loss scaling.")
    check_grad_overflow: StrictBool = Field(True, description="Skip a step whose gradients hold an inf or NaN (false: "
                                            "apply it at stages 1 and 2; stages 0 and 3 skip it anyway, as official).")
    immediate_grad_update: StrictBool = Field(False, description="Move each gradient into the fp32 gradients as soon "
                                              "as autograd produces it: read by stage 1's fp32-accumulation variant, "
                                              "as official reads it only in its BF16_Optimizer; elsewhere no effect.")


class Stage3Settings(_Strict):
    """Official DeepSpeed's stage-3 keys. Below stage 3 it accepts and ignores them, and so does nano."""

    stage3_prefetch_bucket_size: int = Field(50_000_000, ge=0, description="Elements gathered ahead of use.")
    stage3_param_persistence_threshold: int = Field(100_000, ge=0, description="Smaller parameters stay whole on every rank.")
    stage3_model_persistence_threshold: int = Field(sys.maxsize, ge=0, description="Cap on persistent elements in all.")
    stage3_max_live_parameters: int = Field(1_000_000_000, ge=0, description="Gathered elements alive at once, at most.")
    stage3_max_reuse_distance: int = Field(1_000_000_000, ge=0, description="Keep a gathered parameter this close to reuse.")
    stage3_gather_16bit_weights_on_model_save: StrictBool = Field(False, description="Gather whole 16-bit weights on save.")
    stage3_gather_fp16_weights_on_model_save: StrictBool = Field(False, description="Older name of the key above.")
    stage3_module_granularity_threshold: int = Field(0, ge=0, description="Fetch small modules whole.")
    stage3_use_all_reduce_for_fetch_params: StrictBool = Field(False, description="Gather with all-reduce.")
    stage3_allgather_sequential: StrictBool = Field(False, description="Gather parameters one at a time.")
    sub_group_size: int = Field(1_000_000_000, ge=0, description="Elements per optimizer sub-group (stage 3 offload).")


class LeafModuleConfig(_Strict):
    """Official DeepSpeed's leaf modules, read by nano as its stage-3 units (see stage3_units.py)."""

    classes: list[str] = Field(default_factory=list, description="Class names (plain or module-qualified).")
    names: list[str] = Field(default_factory=list, description="Module names as named_modules() gives them.")
    name_suffixes: list[str] = Field(default_factory=list, description="Endings of module names.")

    @field_validator("classes", "names", "name_suffixes", mode="before")
    @classmethod
    def _one_or_many(cls, value: Any) -> Any:
        return [value] if isinstance(value, str) else value


class OffloadConfig(_Strict):
    """Official DeepSpeed's offload sections. nano offloads to the CPU: "nvme" and the keys that
    only tune NVMe swapping are refused unless they keep their defaults."""

    device: Literal["cpu", "none", "nvme"] = Field("none", description="cpu: keep these tensors in host memory.")
    pin_memory: StrictBool = Field(True, description="Page-locked host memory for asynchronous copies "
                                   "(nothing to pin without CUDA: nano says so once).")
    nvme_path: Optional[str] = Field(None, description="NVMe only.")
    buffer_count: Optional[int] = Field(None, description="NVMe only.")

    @field_validator("device")
    @classmethod
    def _cpu_only(cls, device: str) -> str:
        if device == "nvme":
            raise ValueError("nvme is not implemented by nano (it offloads to the CPU only); use \"cpu\"")
        return device

    @model_validator(mode="after")
    def _no_nvme_keys(self) -> "OffloadConfig":
        for key in ("nvme_path", "buffer_count"):
            if getattr(self, key) is not None:
                raise ValueError(f"{key} only tunes NVMe swapping, which nano does not do; remove it")
        return self

    @property
    def enabled(self) -> bool:
        return self.device == "cpu"


class OffloadOptimizerConfig(OffloadConfig):
    pipeline_read: Literal[False] = Field(False, description="NVMe only: accepted as false.")
    pipeline_write: Literal[False] = Field(False, description="NVMe only: accepted as false.")
    fast_init: Literal[False] = Field(False, description="NVMe only: accepted as false.")
    ratio: float = Field(1.0, ge=1.0, le=1.0, description="Share of the optimizer offloaded: nano offloads all (1.0).")


class OffloadParamConfig(OffloadConfig):
    buffer_size: Optional[int] = Field(None, description="NVMe only.")
    max_in_cpu: Optional[int] = Field(None, description="NVMe only.")


class ZeroConfig(Stage3Settings, ZeroPlusPlusSettings):
    stage: StrictInt = Field(0, description="0: data parallel; 1: partition optimizer states; 2: also gradients; "
                             "3: also parameters.")
    reduce_scatter: StrictBool = Field(True, description="Stage 1/2: reduce-scatter (True) or all-reduce + local scatter-back (False).")
    reduce_bucket_size: int = Field(DEFAULT_BUCKET_SIZE, gt=0, description="Elements per gradient bucket.")
    allgather_bucket_size: int = Field(DEFAULT_BUCKET_SIZE, gt=0, description="Elements per parameter all-gather "
                                       "where a backend lacks all_gather_into_tensor (nccl and gloo have it: a buffer is "
                                       "gathered in one call, as official does); even, as official DeepSpeed requires.")
    overlap_comm: Optional[StrictBool] = Field(None, description="Reduce buckets asynchronously (stages 2/3: while "
                                               "backward runs; stages 0/1: while the next bucket is packed), at most "
                                               "two in flight. Unset: true at stage 3, false below, as official "
                                               "DeepSpeed; it plays no part in stage 3's prefetch.")
    contiguous_gradients: StrictBool = Field(True, description="Accepted as true only: nano always packs gradients contiguously.")
    allgather_partitions: StrictBool = Field(True, description="Accepted as true only: nano always all-gathers whole partitions.")
    ignore_unused_parameters: StrictBool = Field(True, description="Stages 2/3: a parameter with no gradient counts as zero (False: error).")
    leaf_module: Optional[LeafModuleConfig] = Field(None, description="Stage 3: the modules that each form a unit "
                                                    "(default: each child of a ModuleList).")
    offload_optimizer: OffloadOptimizerConfig = Field(default_factory=OffloadOptimizerConfig,
                                                      description="Stages 1-3: fp32 masters, Adam states and "
                                                      "gradient partitions in host memory; Adam runs there.")
    offload_param: OffloadParamConfig = Field(default_factory=OffloadParamConfig,
                                              description="Stage 3: parameter partitions in host memory between uses.")

    @field_validator("stage")
    @classmethod
    def _implemented_stage(cls, stage: int) -> int:
        refused = stages.refusal(stage)
        if refused:
            raise ValueError(refused)
        return stage

    @property
    def stage_facts(self) -> stages.Stage:
        """The row of `stage` in the stage table: what it partitions and what follows."""
        return stages.of(self.stage)

    @model_validator(mode="after")
    def _even_gather_bucket(self) -> "ZeroConfig":
        """Official DeepSpeed's stages 1 and 2 assert it (stage 0 gathers nothing, stage 3 gathers units)."""
        size = self.allgather_bucket_size
        if self.stage_facts.gathers_in_allgather_buckets and size % START_ALIGNMENT_FACTOR:
            raise ValueError(f"zero_optimization.allgather_bucket_size {size} is odd; official DeepSpeed requires a "
                             f"multiple of {START_ALIGNMENT_FACTOR} at stages 1 and 2: use {size + 1}")
        return self

    @model_validator(mode="after")
    def _offload_where_it_exists(self) -> "ZeroConfig":
        """As official DeepSpeed: optimizer offload needs a partitioned optimizer (stage 1 or more),
        parameter offload needs partitioned parameters (stage 3)."""
        if self.offload_optimizer.enabled and not self.stage_facts.partitions_optimizer_states:
            raise ValueError("zero_optimization.offload_optimizer needs stage 1, 2 or 3 (stage 0 partitions no "
                             "optimizer state); raise the stage or remove the offload")
        if self.offload_param.enabled and not self.stage_facts.partitions_parameters:
            raise ValueError(f"zero_optimization.offload_param needs stage 3 (stage {self.stage} keeps parameters "
                             "whole on every rank); use stage 3 or remove it")
        return self

    @model_validator(mode="after")
    def _overlap_comm_default(self) -> "ZeroConfig":
        """Official DeepSpeed's default (`runtime/zero/config.py`): true at stage 3, false below."""
        if self.overlap_comm is None:
            self.overlap_comm = self.stage_facts.partitions_parameters
        return self

    @model_validator(mode="after")
    def _stage3_keys_nano_honours(self) -> "ZeroConfig":
        """At stage 3 a key nano cannot honour may only keep official DeepSpeed's default."""
        if self.stage_facts.partitions_parameters:
            for key, default in (("stage3_module_granularity_threshold", 0),
                                 ("stage3_use_all_reduce_for_fetch_params", False),
                                 ("stage3_allgather_sequential", False)):
                if getattr(self, key) != default:
                    raise ValueError(f"zero_optimization.{key} {getattr(self, key)!r} is not implemented by nano's "
                                     f"stage 3 (it gathers each unit whole, in one all-gather); remove the key")
        return self

    @field_validator("contiguous_gradients", "allgather_partitions")
    @classmethod
    def _only_true(cls, value: bool) -> bool:
        if not value:
            raise ValueError("false is not implemented by nano (it always behaves as true); remove the key")
        return value


class DataTypesConfig(_Strict):
    grad_accum_dtype: Optional[Literal["fp32", "bf16", "fp16"]] = Field(
        None, description="dtype gradients accumulate in over a window (null: as nano's stage keeps them).")


class NanoConfig(_Strict):
    train_batch_size: Optional[int] = Field(None, gt=0, description="Global batch: micro x accumulation x world size.")
    train_micro_batch_size_per_gpu: Optional[int] = Field(None, gt=0, description="Samples per rank per forward.")
    gradient_accumulation_steps: Optional[int] = Field(None, gt=0, description="Micro-steps per optimizer step.")
    gradient_clipping: float = Field(1.0, ge=0, description="Clip by the global gradient norm; 0 = off. 1.0 by "
                                     "default, as official DeepSpeed 0.19 (GRADIENT_CLIPPING_DEFAULT).")
    optimizer: Optional[OptimizerConfig] = Field(None, description="Required unless the engine is only used for inference.")
    scheduler: Optional[SchedulerConfig] = Field(None, description="Learning-rate schedule, stepped after each applied step.")
    fp16: Fp16Config = Field(default_factory=Fp16Config, description="fp16 mixed precision.")
    bf16: Bf16Config = Field(default_factory=Bf16Config, alias="bfloat16", description="bf16 mixed precision.")
    zero_optimization: ZeroConfig = Field(default_factory=ZeroConfig, description="ZeRO stage and buckets.")
    communication_data_type: Optional[Literal["fp32", "fp16", "bf16"]] = Field(
        None, description="dtype gradients travel in; default: the parameters' dtype.")
    gradient_allreduce_op: Literal["mean", "sum"] = Field(
        "mean", description="Average gradients over ranks (mean) or add them up (sum).")
    data_types: DataTypesConfig = Field(default_factory=DataTypesConfig, description="dtype of gradient accumulation.")
    steps_per_print: Union[StrictInt, float] = Field(10, description="Rank 0 prints a progress line every this many "
                                                     "steps; accelerate writes inf: never.")
    zero_allow_untested_optimizer: StrictBool = Field(False, description="Official: let ZeRO take a client optimizer "
                                                      "outside its tested list; nano takes Adam and AdamW either way.")
    zero_force_ds_cpu_optimizer: StrictBool = Field(True, description="With offload_optimizer, a client optimizer must "
                                                    "be DeepSpeedCPUAdam (false: any Adam/AdamW), as in official.")
    wall_clock_breakdown: Literal[False] = Field(False, description="Accepted as false only (nano has no timers).")

    @field_validator("steps_per_print")
    @classmethod
    def _positive_or_never(cls, steps: Union[int, float]) -> Union[int, float]:
        if not (steps == math.inf or (isinstance(steps, int) and steps >= 1)):
            raise ValueError("must be a whole number of steps >= 1, or inf (never print)")
        return steps

    @field_validator("gradient_allreduce_op", mode="before")
    @classmethod
    def _lower_case(cls, operation: Any) -> Any:
        return operation.lower() if isinstance(operation, str) else operation

    @model_validator(mode="after")
    def _one_precision(self) -> "NanoConfig":
        if self.fp16.enabled and self.bf16.enabled:
            raise ValueError("fp16.enabled and bf16.enabled are both true; enable at most one")
        return self

    @model_validator(mode="after")
    def _gradients_accumulate_where_nano_keeps_them(self) -> "NanoConfig":
        """Stages 0/1 accumulate in autograd's param.grad (the parameters' dtype), stages 2/3 in their
        fp32 gradient partitions, and stage 1 with bf16 and grad_accum_dtype fp32 in full-size fp32
        gradients (the row `stage_facts` picks says: `gradient_accumulation_precision`); a config
        asking for anything else cannot be honoured. Official refuses the same mixes at stage 0
        ("unsupported mix") and runs fp32 accumulation at stage 1 only without offload."""
        stage, precision = self.stage_facts, self.precision
        wanted = self.data_types.grad_accum_dtype
        kept = stage.gradient_accumulation_precision(precision)
        if wanted is not None and wanted != kept:
            raise ValueError(f"data_types.grad_accum_dtype {wanted} cannot be honoured: nano's {stage.name}"
                             f"{' with offload_optimizer' if self.zero_optimization.offload_optimizer.enabled else ''} "
                             f"accumulates gradients in {kept}; set it to {kept} or remove it")
        return self

    @property
    def stage_facts(self) -> stages.Stage:
        """The stage-table row this configuration runs: its stage, or the stage's variant that
        precision and data_types ask for (`stages.for_run`)."""
        zero = self.zero_optimization
        return stages.for_run(zero.stage, self.precision, self.data_types.grad_accum_dtype,
                              zero.offload_optimizer.enabled)

    @property
    def precision(self) -> str:
        """'fp16', 'bf16' or 'fp32': the dtype of parameters, activations and full-size gradients."""
        return "fp16" if self.fp16.enabled else "bf16" if self.bf16.enabled else "fp32"
