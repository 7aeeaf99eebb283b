"""Which engine a script's `import deepspeed` finds, decided by the child's environment alone.

    nano:     `zero_lab/dropin` first on PYTHONPATH: it holds a package named `deepspeed`, nano's
              drop-in modules, which Python finds before the installed official DeepSpeed;
    official: that directory taken off PYTHONPATH, so the installed package is found.
Both impls get DeepSpeed's accelerator named (`DS_ACCELERATOR=cpu` or `cuda`, as the harness's
launches do) and `zero_lab/clients/site` on PYTHONPATH, whose `sitecustomize` prepares official
DeepSpeed as the harness does (zero_lab.clients) and, when `LOG_CONTRACT` is set to 1, makes the
engine write the log contract of docs/log-format.md. Pure functions: nothing is started here.
"""

from __future__ import annotations

import os
from pathlib import Path

PACKAGE_ROOT = Path(__file__).resolve().parents[1]
DROPIN_DIR = PACKAGE_ROOT / "dropin"  # holds the package `deepspeed` that is nano (issue 18's drop-in)
SITE_DIR = PACKAGE_ROOT / "clients" / "site"  # holds sitecustomize.py, run by every Python child at start-up
LOG_CONTRACT = "ZERO_LAB_LOG_CONTRACT"  # "1": the engine writes [zero], [model], [opt_step], [phase], [comm]
TORCH_EXTENSIONS_DIR = PACKAGE_ROOT.parent / ".torch_extensions"  # official's JIT builds stay in the checkout
IMPLS = ("nano", "official")


def python_path(current: str | None, impl: str) -> str:
    """PYTHONPATH for a child of impl: the site directory first, then (nano) the drop-in, then the
    user's own entries without either of ours."""
    ours = {str(SITE_DIR), str(DROPIN_DIR)}
    theirs = [entry for entry in (current or "").split(os.pathsep) if entry and entry not in ours]
    first = [str(SITE_DIR)] + ([str(DROPIN_DIR)] if impl == "nano" else [])
    return os.pathsep.join(first + theirs)


def impl_environment(base: dict[str, str], impl: str, device: str, log_contract: bool) -> dict[str, str]:
    """The environment for a command whose `import deepspeed` must be impl's, on device (cpu or cuda)."""
    if impl not in IMPLS:
        raise ValueError(f"unknown impl {impl!r}")
    env = dict(base)
    env["PYTHONPATH"] = python_path(base.get("PYTHONPATH"), impl)
    env["DS_ACCELERATOR"] = "cpu" if device == "cpu" else "cuda"
    env.setdefault("TORCH_EXTENSIONS_DIR", str(TORCH_EXTENSIONS_DIR))
    if log_contract:
        env[LOG_CONTRACT] = "1"
    else:
        env.pop(LOG_CONTRACT, None)
    return env
