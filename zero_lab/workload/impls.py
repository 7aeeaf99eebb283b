"""The one difference between a nano run and an official run: which module provides
`init_distributed` and `initialize`, and which config dict it receives.

Official DeepSpeed needs its environment set before `import deepspeed`:
- `DS_ACCELERATOR` naming the run's device, on every device (a leftover `DS_ACCELERATOR=cpu` from
  a CPU session would put a CUDA run on DeepSpeed's CPU accelerator), and on CPU `LOCAL_SIZE`
  (its CPU accelerator reads the local world size there);
- `TORCH_EXTENSIONS_DIR` inside the checkout, so any JIT build stays out of $HOME;
- its first `init_distributed` JIT-builds a shared-memory comm op (about 40 s on 2 cores, and the
  building run has crashed rank 1) that training never uses, so `build_shm_op` is replaced by a
  no-op; `to_official_config` asks for torch's AdamW so FusedAdam is not compiled either;
- on CUDA official builds FusedAdam, which needs nvcc, ninja and CUDA_HOME (`cuda_toolkit.py`):
  without them it gets torch's AdamW too, and `engine_config` says so.
Its INFO logging is lowered to warnings so rank 0's contract lines stay easy to read.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from types import ModuleType

import torch

REPO_ROOT = Path(__file__).resolve().parents[2]


def default_single_process_env() -> None:
    """Let `python harness/train.py` run as world size 1 without torchrun."""
    if "RANK" in os.environ:
        return
    # A world of one never connects to its own rendezvous store: port 0 lets the OS pick any.
    os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1",
                      MASTER_ADDR="127.0.0.1", MASTER_PORT="0")


def load_engine_module(impl: str, device: torch.device) -> ModuleType:
    """`zero_lab.nano` or `deepspeed`, ready for `init_distributed` on this device."""
    if impl == "nano":
        import zero_lab.nano as nano

        return nano
    os.environ["DS_ACCELERATOR"] = accelerator_name(device)
    if device.type == "cpu":
        os.environ.setdefault("LOCAL_SIZE", os.environ.get("LOCAL_WORLD_SIZE", "1"))
    os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(REPO_ROOT / ".torch_extensions"))
    import deepspeed

    if device.type == "cpu":
        sys.modules["deepspeed.comm.torch"].build_shm_op = lambda: None
    logging.getLogger("DeepSpeed").setLevel(logging.WARNING)
    return deepspeed


def accelerator_name(device: torch.device | str) -> str:
    """DeepSpeed's DS_ACCELERATOR for a run's device: `cpu` or `cuda`."""
    return "cpu" if torch.device(device).type == "cpu" else "cuda"


def engine_config(impl: str, config: dict, device: torch.device) -> tuple[dict, list[str]]:
    """The config dict the impl's `initialize` receives (nano's as is, official's converted) and
    the notes to log about it: official on CUDA without the toolkit FusedAdam needs runs torch's
    AdamW instead of failing."""
    if impl == "nano":
        return config, []
    from zero_lab.nano.official_config import to_official_config
    from zero_lab.workload import cuda_toolkit

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
    cls = type(optimizer)
    return f"torch.optim.{cls.__name__}" if cls.__module__.startswith("torch.optim") else cls.__name__


def loss_scale(engine) -> float:
    """The current fp16 loss scale (DeepSpeed's `optimizer.cur_scale`); 1.0 without scaling."""
    scale = getattr(engine.optimizer, "cur_scale", None)
    return float(scale) if scale is not None else 1.0
