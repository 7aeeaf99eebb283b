"""`zero-lab doctor`: versions, devices and backends, and whether official DeepSpeed (and fp16) runs here;
with run or compare directories, why they behaved as they did (`findings_cmd`, docs/doctor.md).

    zero-lab doctor
    zero-lab doctor runs/compare-20260101-120000 --format json
    zero-lab doctor runs/hang --plot parting.png     # each rank's collectives up to where they part

Without a path: exit 0 when every required check passes, 1 otherwise; a warning (no fp16, no CUDA
toolkit) does not fail it. With paths: exit 1 when a finding has severity error, else 0.
"""

from __future__ import annotations

import os
import shutil
import sys

from pathlib import Path
from typing import Annotated, Optional

import typer

from zero_lab.cli import output
from zero_lab.cli.errors import BadInput, check_choice, one_line_errors
from zero_lab.cli.findings_cmd import FORMATS, doctor_paths, plot_parting
from zero_lab.cli.environment import environment
from zero_lab.cli.official_probe import probe_official
from zero_lab.launch import torchrun


def doctor_checks() -> list[tuple[str, bool, str, str]]:
    """(check, ok, detail, fix) for everything a comparison needs."""
    import torch.distributed as dist

    env = environment("auto")
    device = "cuda" if env["gpus"] != "none" else "cpu"
    official = probe_official(device)
    checks = [
        ("python", sys.version_info >= (3, 10), env["python"], "use Python 3.10 or newer"),
        ("torch", env["torch"] is not None, str(env["torch"]), "make setup (or pip install torch)"),
        ("transformers", env["transformers"] is not None, str(env["transformers"]), "pip install transformers"),
        ("deepspeed", env["deepspeed"] is not None, str(env["deepspeed"]), "pip install 'deepspeed>=0.19,<0.20'"),
        ("devices", True, f"{env['cpu_cores']} CPU cores ({env['cpu']}); GPUs: {env['gpus']}", ""),
        ("gloo backend", dist.is_gloo_available(), "CPU collectives", "install a torch build with gloo"),
        ("nccl backend", device == "cpu" or dist.is_nccl_available(), "GPU collectives" if device == "cuda" else "not needed on CPU",
         "install a CUDA build of torch"),
        ("harness", torchrun.TRAIN_SCRIPT.is_file(), str(torchrun.TRAIN_SCRIPT), "reinstall zero-lab: pip install -e . (or pip install .)"),
        ("official DeepSpeed runs here", "error" not in official,
         official.get("error") or f"accelerator {official.get('accelerator')}", "see the error; on CPU set DS_ACCELERATOR=cpu"),
        ("official bf16", bool(official.get("bf16")), "bf16 supported" if official.get("bf16") else "not supported",
         "use --dtype float32"),
        ("official fp16", bool(official.get("fp16")), "fp16 supported" if official.get("fp16") else
         f"not supported on this {device.upper()} (Type fp16 is not supported on your device)", "use --dtype bfloat16 or float32"),
        ("TORCH_EXTENSIONS_DIR", True, os.environ.get("TORCH_EXTENSIONS_DIR", "unset (DeepSpeed builds ops under ~/.cache)"), ""),
        *toolkit_checks(device),
    ]
    return checks


def toolkit_checks(device: str, environ=os.environ, which=shutil.which) -> list[tuple[str, bool, str, str]]:
    """On a GPU machine: CUDA_HOME, nvcc and ninja, which official DeepSpeed needs to build FusedAdam
    (without them official runs torch's AdamW; cuda_toolkit.py). Not needed on CPU."""
    from zero_lab.workload.engines import cuda_toolkit

    if device != "cuda":
        return [(name, True, "not needed on CPU", "") for name in ("CUDA_HOME", "nvcc", "ninja")]
    fallback = " (else official runs torch.optim.AdamW instead of FusedAdam)"
    home = cuda_toolkit.cuda_home(environ, which)
    nvcc = home / "bin" / "nvcc" if home else None
    ninja = which("ninja")
    return [
        ("CUDA_HOME", home is not None, str(home) if home else "not found", "install the CUDA toolkit and set CUDA_HOME" + fallback),
        ("nvcc", bool(nvcc and nvcc.is_file()), str(nvcc) if nvcc and nvcc.is_file() else "not found",
         "install the CUDA toolkit matching torch's CUDA" + fallback),
        ("ninja", ninja is not None, ninja or "not on PATH", "pip install ninja" + fallback),
    ]


REQUIRED = {"python", "torch", "deepspeed", "transformers", "gloo backend", "harness"}


@one_line_errors
def doctor(
    paths: Annotated[Optional[list[Path]], typer.Argument(help="Run or compare directories to diagnose (none: "
                                                                "check this machine).", show_default=False)] = None,
    format: Annotated[str, typer.Option(help="table or json (with paths).")] = "table",
    plot: Annotated[Optional[Path], typer.Option(help="With paths: also draw, in a PNG, each rank's collectives call "
                                                      "by call up to where the ranks part (a collective-mismatch).",
                                                 metavar="FILE")] = None,
) -> None:
    """Check this machine (versions, devices, backends, official DeepSpeed); with run or compare
    directories, say why they behaved as they did: findings with evidence, cause and fix."""
    check_choice(format, "--format", FORMATS)
    if plot and not paths:
        raise BadInput("--plot needs run or compare directories to draw; give them: zero-lab doctor RUN --plot FILE")
    if paths:
        if plot:
            plot_parting(paths, plot)
        doctor_paths(paths, format)
    checks = doctor_checks()
    body = [[name, "ok" if ok else ("PROBLEM" if name in REQUIRED else "warning"), detail, "" if ok else fix]
            for name, ok, detail, fix in checks]
    output.print_table(["check", "status", "detail", "fix"], body, title="zero-lab doctor", numeric=False)
    raise typer.Exit(0 if all(ok for name, ok, _, _ in checks if name in REQUIRED) else 1)
