"""`init_distributed`: join the process group torchrun describes (nccl on CUDA, gloo on CPU)."""

from __future__ import annotations

import datetime
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
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(distributed_port))
    rank = int(os.environ.get("RANK", 0)) if rank < 0 else rank
    world_size = int(os.environ.get("WORLD_SIZE", 1)) if world_size < 0 else world_size
    backend = dist_backend or default_backend()
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    torch.distributed.init_process_group(backend=backend, init_method=init_method, rank=rank, world_size=world_size,
                                         timeout=timeout or datetime.timedelta(minutes=30))
