"""The one difference between a nano run and an official run: which module provides
`init_distributed` and `initialize`, and which config dict it receives.

Official DeepSpeed is prepared around its import by `official_import` (its accelerator, no
shared-memory op build on CPU, quieter logging); on CUDA official builds FusedAdam, which needs
nvcc, ninja and CUDA_HOME (`cuda_toolkit.py`): without them it gets torch's AdamW too, and
`engine_config` says so.
"""

from __future__ import annotations

import os
from types import ModuleType

import torch

from zero_lab.workload.engines import official_import


def default_single_process_env() -> None:
    """Let `python harness/train.py` run as world size 1 without torchrun."""
    if "RANK" in os.environ:
        return
    # A world of one never connects to its own rendezvous store: port 0 lets the OS pick any.
    os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1",
                      MASTER_ADDR="127.0.0.1", MASTER_PORT="0")


def load_engine_module(impl: str, device: torch.device) -> ModuleType:
    """`zero_lab.nano`, `zero_lab.fsdp2` or `deepspeed`, ready for `init_distributed` on this device
    (an own engine, --impl NAME=PATH: `own_engine.load_module`)."""
    if impl == "nano":
        import zero_lab.nano as nano

        return nano
    if impl == "fsdp2":
        import zero_lab.fsdp2 as fsdp2

        return fsdp2
    official_import.prepare_environment(device.type)
    import deepspeed

    official_import.after_import(deepspeed, device.type)
    return deepspeed


def engine_config(impl: str, config: dict, device: torch.device) -> tuple[dict, list[str]]:
    """The config dict the impl's `initialize` receives (nano's as is, official's converted) and
    the notes to log about it: official on CUDA without the toolkit FusedAdam needs runs torch's
    AdamW instead of failing."""
    if impl != "official":  # fsdp2 maps the nano config itself (zero_lab.fsdp2.config_map); own engines read it
        return config, []
    from zero_lab.nano.facade.official_config import to_official_config
    from zero_lab.workload.engines import cuda_toolkit

    official = to_official_config(config, device=device.type)
    params = official.get("optimizer", {}).get("params", {})
    if device.type != "cuda" or "optimizer" not in official or params.get("torch_adam"):
        return official, []
    problems = cuda_toolkit.toolkit_problems()
    if not problems or cuda_toolkit.fused_adam_prebuilt():
        return official, []
    params["torch_adam"] = True
    return official, [f"official DeepSpeed's FusedAdam cannot be built here ({'; '.join(problems)}), so official "
                      "runs torch.optim.AdamW (torch_adam); install the CUDA toolkit and ninja for FusedAdam"]


def optimizer_name(engine) -> str:
    """The torch optimizer an engine steps with, under its ZeRO wrappers: `FusedAdam`,
    `DeepSpeedCPUAdam`, `torch.optim.AdamW`, nano's `PartitionedAdam`."""
    optimizer, seen = engine.optimizer, set()
    while getattr(optimizer, "optimizer", None) is not None and id(optimizer) not in seen:
        seen.add(id(optimizer))
        optimizer = optimizer.optimizer
    if optimizer is None:  # an own engine without one (its optimizer is its own business)
        return "none"
    cls = type(optimizer)
    return f"torch.optim.{cls.__name__}" if cls.__module__.startswith("torch.optim") else cls.__name__


def loss_scale(engine) -> float:
    """The current fp16 loss scale (DeepSpeed's `optimizer.cur_scale`); 1.0 without scaling."""
    scale = getattr(engine.optimizer, "cur_scale", None)
    return float(scale) if scale is not None else 1.0
