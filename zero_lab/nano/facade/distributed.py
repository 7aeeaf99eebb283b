"""`init_distributed`: join the process group torchrun describes (nccl on CUDA, gloo on CPU).

Before the group exists it imports `torch._dynamo`, which the first `torch.optim.Optimizer` would
otherwise import after it: several modules that import pulls in (`torch.distributed.nn.functional`,
FSDP's grad scaler) take `group.WORLD` as a default argument, evaluated at import, so imported late
they hold the world group past `destroy_process_group()`. Its gloo threads then live into the
interpreter's teardown and can abort the process ("terminate called without an active exception",
SIGABRT) after a script has finished: 4 of 40 two-rank runs of tests/clients/plain_initialize.py on
2 loaded cores. Imported first, those defaults are None and the group is gone when the script
destroys it.
"""

from __future__ import annotations

import datetime
import importlib
import os
from typing import Optional

import torch
import torch.distributed


def default_backend() -> str:
    return "nccl" if torch.cuda.is_available() else "gloo"


def init_distributed(dist_backend: Optional[str] = None, auto_mpi_discovery: bool = True,
                     distributed_port: int = 29500, verbose: bool = True, timeout: Optional[datetime.timedelta] = None,
                     init_method: Optional[str] = None, dist_init_required: Optional[bool] = None,
                     config=None, rank: int = -1, world_size: int = -1) -> None:
    """Initialise torch.distributed from torchrun's environment; a second call does nothing.

    Without torchrun's variables a single process runs as rank 0 of 1 (MASTER_ADDR 127.0.0.1).
    `auto_mpi_discovery`, `distributed_port`, `verbose` and `config` are accepted for DeepSpeed
    compatibility; nano discovers ranks only from the environment.
    """
    if torch.distributed.is_initialized() or dist_init_required is False:
        return
    importlib.import_module("torch._dynamo")  # before the group exists: see the module docstring
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(distributed_port))
    rank = int(os.environ.get("RANK", 0)) if rank < 0 else rank
    world_size = int(os.environ.get("WORLD_SIZE", 1)) if world_size < 0 else world_size
    backend = dist_backend or default_backend()
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    torch.distributed.init_process_group(backend=backend, init_method=init_method, rank=rank, world_size=world_size,
                                         timeout=timeout or datetime.timedelta(minutes=30))
