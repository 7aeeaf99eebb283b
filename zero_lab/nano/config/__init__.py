"""nano's DeepSpeed config: the typed model, the keys nano knows, and the reading of a source.

    keys.py     which DeepSpeed keys nano reads, and which it knows of but does not implement
    schema.py   the typed config (one pydantic model per section, DeepSpeed's names and defaults)
    loading.py  a dict, JSON path or `args.deepspeed_config` -> a checked `NanoConfig`, in phases

Off the step's path: the engine reads a `NanoConfig` once, at `initialize`. Every name below is
importable from `zero_lab.nano.config`, as it was when the config was one module; each is imported
on first use (PEP 562), so `zero_lab.nano.config.keys` loads no pydantic (the CLI starts fast).
"""

import importlib

_NAMES = {
    "keys": ("OFFLOAD_SECTIONS",),
    "schema": ("DEFAULT_BUCKET_SIZE", "Bf16Config", "DataTypesConfig", "Fp16Config", "LeafModuleConfig",
               "NanoConfig", "OffloadConfig", "OffloadOptimizerConfig", "OffloadParamConfig", "OptimizerConfig",
               "OptimizerParams", "SchedulerConfig", "Stage3Settings", "ZeroConfig"),
    "loading": ("load_config", "official_only_keys", "read_config_source", "validate_config",
                "without_official_only_keys"),
}
_MODULE_OF = {name: module for module, names in _NAMES.items() for name in names}
__all__ = list(_MODULE_OF)


def __getattr__(name: str):
    if name not in _MODULE_OF:
        raise AttributeError(f"module 'zero_lab.nano.config' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"zero_lab.nano.config.{_MODULE_OF[name]}"), name)
    globals()[name] = value
    return value
