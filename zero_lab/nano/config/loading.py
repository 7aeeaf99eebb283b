"""Reading a DeepSpeed config into nano's typed config (`schema.py`), in phases:

    Phase 1: read the source (dict, JSON path, or `args.deepspeed_config`).
    Phase 2: reject keys nano does not know, saying whether official DeepSpeed knows them
             (`without_official_only_keys` is the part of a config for official that nano checks).
    Phase 3: resolve "auto" values that can be derived; reject the rest; map legacy offload switches.
    Phase 4: validate types and ranges (pydantic), turning the first error into one line.
    Phase 5: infer and check train_batch_size = micro batch x accumulation steps x world size.
Every error is a `NanoConfigError` whose message names the field and the fix.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

from pydantic import ValidationError

from zero_lab.nano import stages
from zero_lab.nano.config import keys as config_keys
from zero_lab.nano.config.schema import (Bf16Config, DataTypesConfig, Fp16Config, NanoConfig,
                                         ZeroConfig)
from zero_lab.nano.errors import NanoConfigError
from zero_lab.nano.config.zeropp import hpz_world_problem

BATCH_KEYS = ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps")
# The zero_optimization keys whose "auto" the Hugging Face Trainer derives from the model's hidden size h
# (transformers' integrations/deepspeed.py, `trainer_config_finalize`): key -> (stages it fills it at, rule).
HIDDEN_SIZE_RULES = {
    "reduce_bucket_size": (stages.IMPLEMENTED, lambda h: h * h),
    "stage3_prefetch_bucket_size": ((3,), lambda h: int(0.9 * h * h)),
    "stage3_param_persistence_threshold": ((3,), lambda h: 10 * h),
}


def read_config_source(config: Any = None, args: Any = None) -> dict:
    """Phase 1: the raw dict from a dict, a JSON path, or `args.deepspeed_config`."""
    if config is None and args is not None:
        config = getattr(args, "deepspeed_config", None)
    if config is None:
        raise NanoConfigError("no DeepSpeed config given; pass config=dict or path, or --deepspeed_config PATH")
    if isinstance(config, dict):
        return json.loads(json.dumps(config))  # a deep copy that also proves it is JSON
    path = Path(config)
    if not path.is_file():
        raise NanoConfigError(f"config file {path} does not exist; pass an existing JSON path")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise NanoConfigError(f"config file {path} is not valid JSON ({error.msg} at line {error.lineno}); fix the file")


def _sections(raw: dict):
    """(section, the keys nano reads there, the keys only official DeepSpeed knows there, the dotted
    prefix) for every section whose keys nano checks."""
    top_level = {field.alias or name for name, field in NanoConfig.model_fields.items()} | set(NanoConfig.model_fields)
    yield raw, top_level, config_keys.DEEPSPEED_ONLY_TOP_LEVEL, ""
    for section, model, deepspeed_only in (("fp16", Fp16Config, config_keys.DEEPSPEED_ONLY_FP16),
                                           ("bf16", Bf16Config, config_keys.DEEPSPEED_ONLY_BF16),
                                           ("bfloat16", Bf16Config, config_keys.DEEPSPEED_ONLY_BF16),
                                           ("data_types", DataTypesConfig, config_keys.DEEPSPEED_ONLY_DATA_TYPES),
                                           ("zero_optimization", ZeroConfig, config_keys.DEEPSPEED_ONLY_ZERO)):
        if isinstance(raw.get(section), dict):
            legacy = set(config_keys.LEGACY_OFFLOAD_KEYS) if section == "zero_optimization" else set()
            yield raw[section], set(model.model_fields) | legacy, deepspeed_only, f"{section}."


def official_only_keys(raw: dict) -> list[str]:
    """The keys of a raw config (dotted: `zero_optimization.round_robin_gradients`) that official
    DeepSpeed knows and nano does not implement."""
    return [f"{prefix}{key}" for section, known, deepspeed_only, prefix in _sections(raw)
            for key in section if key not in known and key in deepspeed_only]


def without_official_only_keys(raw: dict) -> dict:
    """A copy of a config meant for official DeepSpeed, less the keys only official knows: the part
    nano checks (`--impl official` passes those keys through to official as they are)."""
    part = json.loads(json.dumps(raw))
    for section, known, deepspeed_only, _ in list(_sections(part)):
        for key in [key for key in section if key not in known and key in deepspeed_only]:
            del section[key]
    return part


def _reject_unknown_keys(raw: dict) -> None:
    """Phase 2: every key must be one nano reads; DeepSpeed-only keys get their own message."""
    zero = raw.get("zero_optimization")
    if isinstance(zero, dict):
        refused = stages.refusal(zero.get("stage", 0))
        if refused:
            raise NanoConfigError(f"zero_optimization.stage: {refused}")
    for section, known, deepspeed_only, prefix in _sections(raw):
        for key in section:
            if key in known:
                continue
            if key in deepspeed_only:
                raise NanoConfigError(f"config key '{prefix}{key}' is known to official DeepSpeed but not implemented "
                                      "by nano; remove it, or run with --impl official, which passes it through to "
                                      "official DeepSpeed")
            raise NanoConfigError(f"unknown config key '{prefix}{key}'; check its spelling against DeepSpeed's docs")
    for section, names in (("optimizer", config_keys.DEEPSPEED_ONLY_OPTIMIZERS),
                           ("scheduler", config_keys.DEEPSPEED_ONLY_SCHEDULERS)):
        kind = raw.get(section, {}).get("type") if isinstance(raw.get(section), dict) else None
        if kind in names:
            raise NanoConfigError(f"{section}.type '{kind}' is known to official DeepSpeed but not implemented by "
                                  f"nano; use {'AdamW, Adam or Muon' if section == 'optimizer' else 'WarmupLR, WarmupDecayLR or WarmupCosineLR'}")


def _resolve_auto(raw: dict, hidden_size: Optional[int]) -> None:
    """Phase 3: "auto" batch sizes are inferred; the "auto"s the HF Trainer derives from the hidden
    size follow its rule (`HIDDEN_SIZE_RULES`), or take DeepSpeed's defaults for a model without
    `config.hidden_size`."""
    for key in BATCH_KEYS:
        if raw.get(key) == "auto":
            del raw[key]
    zero = raw.get("zero_optimization", {})
    stage = zero.get("stage", 0) if isinstance(zero, dict) else 0
    for key, (at_stages, rule) in HIDDEN_SIZE_RULES.items():
        if isinstance(zero, dict) and zero.get(key) == "auto" and stage in at_stages:
            if hidden_size:
                zero[key] = rule(hidden_size)
            else:
                del zero[key]

    def find_auto(node: Any, path: str) -> Optional[str]:
        if node == "auto":
            return path
        children = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
        for key, child in children:
            found = find_auto(child, f"{path}.{key}" if path else str(key))
            if found:
                return found
        return None

    leftover = find_auto(raw, "")
    if leftover:
        raise NanoConfigError(f"config value '{leftover}' is \"auto\", which only the Hugging Face Trainer fills in; "
                              "give an explicit value")


def _map_legacy_offload(raw: dict) -> None:
    """Phase 3: `cpu_offload: true` is `offload_optimizer: {device: cpu}` (and `cpu_offload_param`
    `offload_param`), as official DeepSpeed maps them; false asks for nothing."""
    zero = raw.get("zero_optimization")
    if not isinstance(zero, dict):
        return
    for legacy, section in config_keys.LEGACY_OFFLOAD_KEYS.items():
        if legacy not in zero:
            continue
        if section in zero:
            raise NanoConfigError(f"zero_optimization.{legacy} and zero_optimization.{section} are both given; "
                                  f"keep {section} ({legacy} is its deprecated switch)")
        value = zero.pop(legacy)
        if not isinstance(value, bool):
            raise NanoConfigError(f"config field 'zero_optimization.{legacy}': must be true or false (got {value!r})")
        if value:
            zero[section] = {"device": "cpu"}


def _first_error_line(error: ValidationError) -> str:
    """Phase 4 helper: the first pydantic error as 'field.path: message'."""
    first = error.errors()[0]
    location = ".".join(str(part) for part in first["loc"])
    message = first["msg"].removeprefix("Value error, ")
    if first["type"] == "extra_forbidden":
        return f"unknown config key '{location}'; check its spelling against DeepSpeed's docs"
    if isinstance(first.get("input"), dict):  # a rule across a section's keys: its message names them
        return message
    return f"config field '{location}': {message} (got {first.get('input')!r})"


def _infer_batch_sizes(config: NanoConfig, world_size: int) -> None:
    """Phase 5: DeepSpeed's rule, train_batch_size == micro x accumulation x world size."""
    total, micro, accumulation = (config.train_batch_size, config.train_micro_batch_size_per_gpu,
                                  config.gradient_accumulation_steps)
    if total is None and micro is None:
        raise NanoConfigError("config needs train_batch_size or train_micro_batch_size_per_gpu; add one")
    if total is not None and micro is not None and accumulation is not None:
        if total != micro * accumulation * world_size:
            raise NanoConfigError(
                f"train_batch_size {total} != train_micro_batch_size_per_gpu {micro} x gradient_accumulation_steps "
                f"{accumulation} x world size {world_size}; fix one of them or drop train_batch_size")
    elif total is not None and micro is not None:
        accumulation = total // (micro * world_size)
    elif total is not None:
        accumulation = accumulation or 1
        micro = total // (accumulation * world_size)
    else:
        accumulation = accumulation or 1
        total = micro * accumulation * world_size
    if micro < 1 or accumulation < 1 or total != micro * accumulation * world_size:
        raise NanoConfigError(f"train_batch_size {total} is not divisible into micro batches over world size "
                              f"{world_size}; make it a multiple of micro batch x world size")
    config.train_batch_size, config.train_micro_batch_size_per_gpu = total, micro
    config.gradient_accumulation_steps = accumulation


def validate_config(config: Any = None, args: Any = None, hidden_size: Optional[int] = None) -> NanoConfig:
    """Phases 1-4: a typed config whose batch sizes are still as given (world size unknown)."""
    raw = read_config_source(config, args)
    if not isinstance(raw, dict):
        raise NanoConfigError("config must be a JSON object at the top level; wrap the keys in {}")
    _reject_unknown_keys(raw)
    _resolve_auto(raw, hidden_size)
    _map_legacy_offload(raw)
    try:
        return NanoConfig.model_validate(raw)
    except ValidationError as error:
        raise NanoConfigError(_first_error_line(error)) from None


def load_config(config: Any = None, args: Any = None, world_size: int = 1,
                hidden_size: Optional[int] = None) -> NanoConfig:
    """Read, check and complete a DeepSpeed config for `world_size` ranks (see the module phases)."""
    parsed = validate_config(config, args, hidden_size)
    _infer_batch_sizes(parsed, world_size)
    problem = hpz_world_problem(parsed.zero_optimization.zero_hpz_partition_size, world_size)
    if problem:
        raise NanoConfigError(problem)
    return parsed
