"""Whether this machine can JIT-build a CUDA op, the way official DeepSpeed builds FusedAdam on a GPU.

DeepSpeed compiles `fused_adam` at its first CUDA run unless the op was built into its wheel. That
needs three things torch's extension builder looks for: `nvcc`, under a CUDA toolkit root
(CUDA_HOME, else CUDA_PATH, else the directory above the `nvcc` on PATH, else /usr/local/cuda), and
`ninja` on PATH. A machine with torch and a GPU driver but no toolkit (most containers) has none of
them, and every official run would fail at start-up. The harness asks `toolkit_problems` first and,
where the default optimizer cannot be built, gives official torch's AdamW (`torch_adam`) instead.

Pure functions over an environment and a `which`, so they are tested without a toolkit; no torch.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Callable, Mapping

DEFAULT_CUDA_HOME = Path("/usr/local/cuda")


def cuda_home(environ: Mapping[str, str] = os.environ, which: Callable[[str], str | None] = shutil.which,
              default: Path = DEFAULT_CUDA_HOME) -> Path | None:
    """The CUDA toolkit root torch's extension builder would use, or None."""
    for name in ("CUDA_HOME", "CUDA_PATH"):
        if environ.get(name):
            return Path(environ[name])
    nvcc = which("nvcc")
    if nvcc:
        return Path(nvcc).resolve().parent.parent
    return default if default.is_dir() else None


def toolkit_problems(environ: Mapping[str, str] = os.environ, which: Callable[[str], str | None] = shutil.which,
                     default: Path = DEFAULT_CUDA_HOME) -> list[str]:
    """What building a CUDA op lacks here, one phrase each (empty: nvcc, ninja and CUDA_HOME found)."""
    problems = []
    home = cuda_home(environ, which, default)
    if home is None:
        problems.append("no CUDA_HOME (and no nvcc on PATH, no /usr/local/cuda)")
    elif not (home / "bin" / "nvcc").is_file():
        problems.append(f"no nvcc in {home / 'bin'}")
    if not which("ninja"):
        problems.append("no ninja on PATH")
    return problems


def fused_adam_prebuilt() -> bool:
    """Whether the installed DeepSpeed carries a compiled fused_adam (then nothing is built)."""
    try:
        from deepspeed.git_version_info import installed_ops
    except ImportError:
        return False
    return bool(installed_ops.get("fused_adam"))
