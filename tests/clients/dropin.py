"""Running a script with `import deepspeed` answered by nano (zero_lab/dropin first on PYTHONPATH) or by
official DeepSpeed, as a user would: a fresh interpreter (or torchrun) per run."""

from __future__ import annotations

import functools
import os
import subprocess
import sys
from pathlib import Path

import zero_lab

DROPIN = Path(zero_lab.__file__).resolve().parent / "dropin"
IMPLS = ("nano", "official")


def environment(impl: str, **extra: str) -> dict:
    """The environment of a run of `impl`: nano puts the drop-in first on PYTHONPATH; official runs on
    the CPU accelerator (DS_ACCELERATOR=cpu), and neither sees the other."""
    env = {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "RANK", "WORLD_SIZE",
                                                                           "LOCAL_RANK", "MASTER_PORT")}
    env.update(DS_ACCELERATOR="cpu", OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false",
               TRANSFORMERS_VERBOSITY="error", HF_HUB_OFFLINE="1", **extra)
    env.setdefault("TORCH_EXTENSIONS_DIR", str(DROPIN.parents[1] / ".torch_extensions"))
    if impl == "nano":
        env["PYTHONPATH"] = str(DROPIN)
    return env


def run_python(impl: str, code: str, timeout: float = 300, **extra: str) -> subprocess.CompletedProcess:
    """`python -c code` with `import deepspeed` resolving to `impl`."""
    return subprocess.run([sys.executable, "-c", code], env=environment(impl, **extra), capture_output=True,
                          text=True, timeout=timeout)


@functools.cache
def official_shared_memory_op_built() -> int:
    """Official DeepSpeed on CPU JIT-builds its shared-memory comm op at its first `init_distributed`
    (3 min on 2 quiet cores, 13.6 min at load 25: past a launch's 900 s): built here once per session,
    in one process with its own bound, so that no launch's bound counts the compile; every launch
    then loads it, as a user's second run does. A failed build is left to the launch, which builds
    it as before. Returns the build's exit code."""
    code = "import sys, deepspeed.comm.torch; sys.modules['deepspeed.comm.torch'].build_shm_op()"
    return subprocess.run([sys.executable, "-c", code], env=environment("official"), capture_output=True,
                          timeout=3600).returncode


def run_torchrun(impl: str, world_size: int, script: Path, args: list[str], timeout: float = 900,
                 **extra: str) -> subprocess.CompletedProcess:
    """`torchrun --nproc_per_node world_size script args` (a free rendezvous port each run); official's
    shared-memory op is built first, outside the launch's bound."""
    if impl == "official":
        official_shared_memory_op_built()
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(world_size),
               "--rdzv_backend", "c10d", "--rdzv_endpoint", "127.0.0.1:0", str(script), *args]
    return subprocess.run(command, env=environment(impl, **extra), capture_output=True, text=True, timeout=timeout)
