"""What official DeepSpeed needs around `import deepspeed` to run here as the harness runs it:
the built-in workload (`impls.load_engine_module`) and a user's script launched by zero-lab
(`zero_lab.clients.startup`) both go through these two functions. No torch import here: a
script's start-up calls `prepare_environment` before anything heavy is loaded.

Before the import (`prepare_environment`):
- `DS_ACCELERATOR` naming the run's device, on every device (a leftover `DS_ACCELERATOR=cpu` from
  a CPU session would put a CUDA run on DeepSpeed's CPU accelerator), and on CPU `LOCAL_SIZE`
  (its CPU accelerator reads the local world size there);
- `TORCH_EXTENSIONS_DIR` inside the checkout, so any JIT build stays out of $HOME;
- on CUDA, `TORCH_CUDA_ARCH_LIST` without arch-specific suffixes ("9.0a" becomes "9.0"), which
  DeepSpeed 0.19.8's op builder cannot parse (`cuda_toolkit.deepspeed_arch_list`).
After it (`after_import`):
- its first `init_distributed` on CPU JIT-builds a shared-memory comm op (about 40 s on 2 cores,
  and the building run has crashed rank 1) that training never uses, so `build_shm_op` becomes
  a no-op;
- its INFO logging is lowered to warnings so rank 0's contract lines stay easy to read.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from types import ModuleType

REPO_ROOT = Path(__file__).resolve().parents[3]


def prepare_environment(device_type: str) -> None:
    """Before `import deepspeed`, for a run on device_type (`cpu` or `cuda`)."""
    os.environ["DS_ACCELERATOR"] = "cpu" if device_type == "cpu" else "cuda"
    if device_type == "cpu":
        os.environ.setdefault("LOCAL_SIZE", os.environ.get("LOCAL_WORLD_SIZE", "1"))
        # Official's Muon wraps Newton-Schulz in torch.compile, compiled at the first step; dynamo's
        # own switch runs it eagerly, with the same losses (docs/muon.md).
        os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")
    os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(REPO_ROOT / ".torch_extensions"))
    if device_type != "cpu" and os.environ.get("TORCH_CUDA_ARCH_LIST"):
        from zero_lab.workload.engines.cuda_toolkit import deepspeed_arch_list
        os.environ["TORCH_CUDA_ARCH_LIST"] = deepspeed_arch_list(os.environ["TORCH_CUDA_ARCH_LIST"])


def after_import(deepspeed: ModuleType, device_type: str) -> None:
    """Once official `deepspeed` is imported: no shared-memory op build on CPU, quieter logging."""
    if device_type == "cpu":
        sys.modules["deepspeed.comm.torch"].build_shm_op = lambda: None
    logging.getLogger("DeepSpeed").setLevel(logging.WARNING)
