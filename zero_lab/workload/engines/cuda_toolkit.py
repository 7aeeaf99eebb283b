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
import re
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


# One entry of TORCH_CUDA_ARCH_LIST: major.minor, an optional arch-specific suffix (Hopper's "9.0a",
# Blackwell's "10.0f"), an optional "+PTX".
_ARCH_ENTRY = re.compile(r"^(\d+)\.(\d+)([a-z]*)(\+PTX)?$")


def deepspeed_arch_list(value: str) -> str:
    """TORCH_CUDA_ARCH_LIST as DeepSpeed 0.19.8's JIT builder can read it.

    Its builder sorts the entries by `int()` of each dotted part, so an arch-specific suffix stops
    every official CUDA run at FusedAdam's build (`ValueError: invalid literal for int() with base
    10: '0a'`, seen on the first H200 run, whose image sets "9.0a"). FusedAdam uses no arch-specific
    instruction: the plain architecture ("9.0") builds the same kernel. Entries it cannot read are
    kept as they are; duplicates made by the rewrite are dropped, in order."""
    entries: list[str] = []
    for entry in value.replace(" ", ";").split(";"):
        entry = entry.strip()
        if not entry:
            continue
        match = _ARCH_ENTRY.match(entry)
        if match:
            entry = f"{match[1]}.{match[2]}{match[4] or ''}"
        if entry not in entries:
            entries.append(entry)
    return ";".join(entries)
