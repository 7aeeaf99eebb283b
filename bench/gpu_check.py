"""GPU readiness in one command: on a machine with one CUDA GPU and a Python that has torch, install
what it lacks from wheels carried with the tree, run the GPU tests, then compare nano and official
DeepSpeed and FSDP2 on qwen3-0.6b (bf16, one GPU) and print one compact table to paste.

    make gpu-wheels                  # here, where pip reaches PyPI: fill .whl/ (git-ignored, ~6 MB)
    make gpu-check                   # there: python3 bench/gpu_check.py
    python3 bench/gpu_check.py --dry-run    # the plan: what is missing, the commands; runs nothing

Phase 1 (`--build-wheels`, run with the venv that passes the tests): build official DeepSpeed's
         pure-Python wheel from its sdist (no op is compiled: DeepSpeed JIT-builds them where they
         run) and download the wheels of its and zero-lab's other missing needs (pytest too), each
         at the version installed here, for the GPU machine's Python (`--python-version`, 3.12).
Phase 2: find which needed modules the machine's Python lacks; install every carried wheel into
         a folder of the checkout (`.gpu-site/`, git-ignored) with pip, offline, no dependencies;
         zero-lab itself runs from the checkout (PYTHONPATH), nothing is built.
Phase 3: the steps of `plan`, one after another, each within its share of the budget:
         `pytest -m gpu` (parity at W=1 through NCCL at stages 0-3, exact bytes at phase
         boundaries, offload with pinned memory, zero.Init, FSDP2 on CUDA), then the three-way
         `zero-lab compare --impls nano,official,fsdp2` at stages 2 and 3 (FSDP2 has no stage 1),
         then nano and official with the optimizer offloaded at stages 2 and 3. The comparisons
         run with ZERO_LAB_COLLECTIVES_AT_WORLD_ONE=1, so nano's every collective goes through
         NCCL on the one GPU (FSDP2 at world size 1 copies instead of communicating: torch's
         own shortcut, so its comm MB are 0). Official's FusedAdam
         JIT-builds into `.torch_extensions/` where nvcc and ninja exist (else official runs
         torch's AdamW; the table's `optimizer` column says which).
Phase 4: one table of every run: optimizer, memory, peak, step time, the largest loss delta of
         its impl against any other of its cell, predicted against measured peak.
A step past its share is stopped as a user would stop it: SIGTERM first (the CLI then stops its
torchrun, whose ranks follow, and writes what it measured), SIGKILL only after a grace period; the
CLI's torchrun also dies with the CLI (a parent-death signal), so no rank keeps the GPU.
The whole check stays within --budget-s (470 s, under the 8-minute goal).
Exit codes: 0 fine; 1 a gate failed (a GPU test, loss parity); 2 the machine is not ready (no CUDA
GPU, no wheels for what is missing; one `error:` line); 3 a run failed or the budget ran out.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import NamedTuple

REPO = Path(__file__).resolve().parents[1]
WHEEL_DIR = REPO / ".whl"
SITE_DIR = REPO / ".gpu-site"
RUN_DIR = REPO / "runs" / "gpu-check"
REPORT = REPO / "reports" / "gpu-check.md"
# Module -> distribution, for what a GPU machine with torch, transformers, typer, rich, pandas,
# matplotlib and psutil still lacks (KINDS.md lists what the nvidia-h200 image holds).
NEEDED = {"deepspeed": "deepspeed", "pydantic": "pydantic", "pydantic_core": "pydantic-core", "hjson": "hjson",
          "annotated_types": "annotated-types", "typing_inspection": "typing-inspection",
          "pytest": "pytest", "pluggy": "pluggy", "iniconfig": "iniconfig"}
# Installed with pydantic, which needs a newer one than some images hold.
ALSO_CARRIED = ("typing-extensions",)
SOURCE_BUILT = ("deepspeed",)  # published as an sdist only; its wheel is pure Python
WORKLOAD = ["--model", "qwen3-0.6b", "--dtype", "bfloat16", "--gpus", "1", "--device", "cuda", "--stages", "2,3",
            "--impls", "nano,official,fsdp2", "--steps", "10", "--seq-len", "512", "--batch-size", "1"]
# Host Adam: fewer steps. nano and official only: FSDP2's CPUOffloadPolicy moves parameters and
# gradients to the host too, a different workload.
OFFLOAD_WORKLOAD = {"--stages": "2,3", "--steps": "5", "--offload": "optimizer", "--impls": "nano,official"}
BUDGET_S = 470.0
GRACE_S = 45.0  # after SIGTERM: the CLI stops torchrun and writes its summaries
# Each step's most seconds (the last step: what is left). Estimates, not yet measured (no GPU run
# has happened): the GPU tests a minute or less; each qwen3-0.6b run some 30 s of start-up, six
# in the three-way comparison (official's first also builds FusedAdam). Stage 1 (nano against
# official) left the comparison when FSDP2 joined, which keeps the runs at ten within the budget;
# `pytest -m gpu` still runs nano's stage 1 through NCCL.
SHARES_S = {"gpu tests": 90.0, "three-way": 220.0}


class Step(NamedTuple):
    """One command of Phase 3, stopped after `share_s` seconds (None: whatever budget is left)."""

    label: str
    command: list[str]
    env: dict[str, str] = {}
    share_s: float | None = None
    compare_dir: Path | None = None  # a comparison's run directory (its compare.json feeds the table)


def wheel_build_commands(python: str, python_version: str, versions: dict[str, str], wheel_dir: Path) -> list[list[str]]:
    """Phase 1: pip commands that fill wheel_dir with every carried distribution at `versions`."""
    pins = [f"{name}=={versions[name]}" for name in (*NEEDED.values(), *ALSO_CARRIED)]
    built = [pin for pin in pins if pin.split("==")[0] in SOURCE_BUILT]
    downloaded = [pin for pin in pins if pin.split("==")[0] not in SOURCE_BUILT]
    return [
        [python, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(wheel_dir), *built],
        [python, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "--python-version", python_version,
         "--implementation", "cp", "--platform", "manylinux_2_17_x86_64", "--platform", "manylinux2014_x86_64",
         "-d", str(wheel_dir), *downloaded],
    ]


def missing_modules(find_spec=importlib.util.find_spec) -> list[str]:
    """Phase 2: the needed modules this Python cannot import."""
    return [module for module in NEEDED if find_spec(module) is None]


def install_command(python: str, wheels: list[Path], site_dir: Path) -> list[str]:
    """Phase 2: install the carried wheels offline into site_dir (one version of each)."""
    return [python, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile", "--no-cache-dir",
            "--upgrade", "--target", str(site_dir), *[str(wheel) for wheel in wheels]]


def check_wheels(missing: list[str], wheels: list[Path]) -> str | None:
    """The problem when wheels for the missing modules are not carried (None when they are)."""
    names = {wheel.name.split("-")[0].lower().replace("_", "-") for wheel in wheels}
    lacking = [NEEDED[module] for module in missing if NEEDED[module] not in names]
    if not lacking:
        return None
    return (f"this Python lacks {', '.join(lacking)} and {WHEEL_DIR.name}/ has no wheel for it. "
            f"Run `make gpu-wheels` where pip reaches PyPI and carry {WHEEL_DIR.name}/ with the tree")


def compare_command(python: str, run_dir: Path, report: Path, overrides: dict[str, str] | None = None) -> list[str]:
    """Phase 3: a comparison of the issue's workload (flags in `overrides` replaced or added), run
    from the checkout."""
    flags = dict(zip(WORKLOAD[::2], WORKLOAD[1::2])) | (overrides or {})
    return [python, "-m", "zero_lab.cli.app", "compare", *[part for pair in flags.items() for part in pair],
            "--out", str(run_dir.parent), "--name", run_dir.name, "--report", str(report), "--stall-timeout", "300"]


def plan(python: str, stamp: str) -> list[Step]:
    """Phase 3's steps, in order: the GPU tests, the three-way comparison, nano and official with
    offload."""
    at_world_one = {"ZERO_LAB_COLLECTIVES_AT_WORLD_ONE": "1"}
    compare_dir = RUN_DIR.with_name(f"{RUN_DIR.name}-{stamp}")
    offload_dir = RUN_DIR.with_name(f"{RUN_DIR.name}-offload-{stamp}")
    return [
        Step("gpu tests", [python, "-m", "pytest", "-q", "-m", "gpu", "-p", "no:cacheprovider", "tests"],
             share_s=SHARES_S["gpu tests"]),
        Step("three-way", compare_command(python, compare_dir, REPORT), at_world_one, SHARES_S["three-way"],
             compare_dir),
        Step("compare offload", compare_command(python, offload_dir, REPORT.with_name("gpu-check-offload.md"),
                                                OFFLOAD_WORKLOAD), at_world_one, compare_dir=offload_dir),
    ]


def step_time_s(step: Step, left_s: float) -> float:
    """The seconds a step may run before its SIGTERM: its share, and never so long that it could
    not be stopped (SIGTERM, then the grace period) before the whole budget is spent."""
    return max(1.0, min(step.share_s or left_s, left_s - GRACE_S))


def run_step(command: list[str], env: dict[str, str], timeout_s: float, grace_s: float = GRACE_S) -> tuple[int, bool]:
    """Run one step; past `timeout_s` stop it with SIGTERM, and SIGKILL only if it is still there
    after `grace_s`. Returns (exit code, whether it ran past its time). The step dies with this
    script too (a parent-death signal), should a CI runner kill the script itself."""
    from zero_lab.launch.torchrun import child_dies_with_parent

    process = subprocess.Popen(command, env=env, cwd=REPO, preexec_fn=child_dies_with_parent)
    try:
        return process.wait(timeout=max(1.0, timeout_s)), False
    except subprocess.TimeoutExpired:
        process.terminate()
        try:
            return process.wait(timeout=grace_s), True
        except subprocess.TimeoutExpired:
            process.kill()
            return process.wait(), True
    except BaseException:  # Ctrl-C or SIGTERM to gpu-check itself: the step stops too
        process.terminate()
        process.wait()
        raise


def compact_table(comparisons: list[dict]) -> str:
    """Phase 4: a line per run of every comparison: its optimizer, memory, peak, step time, the
    largest step loss delta between its impl and any other of its cell (with two impls, the
    cell's one delta), and the predicted peak against the measured one."""
    from zero_lab.analysis.markdown import fmt, markdown_table

    headers = ["stage", "offload", "impl", "optimizer", "status", "alloc MB", "peak MB", "step ms",
               "max loss delta", "predicted peak MB", "peak error %"]
    body = []
    for comparison in comparisons:
        for row in comparison.get("rows", []):
            body.append([str(row["stage"]), row.get("offload") or "none", row["impl"], row.get("optimizer") or "-",
                         row["status"], fmt(row.get("alloc_max_mb")), fmt(row.get("peak_alloc_max_mb")),
                         fmt(row.get("step_ms")), fmt(largest_loss_delta(comparison.get("deltas", []), row), 6),
                         fmt(row.get("predicted_peak_mb")), fmt(row.get("peak_error_pct"), 1, signed=True)])
    return markdown_table(headers, body)


def largest_loss_delta(deltas: list[dict], row: dict) -> float | None:
    """The largest max_step_loss_delta of the deltas of row's cell that row's impl takes part in
    (None when there is none, or one is NaN's null: a gap not known is not a small one)."""
    gaps = [delta.get("max_step_loss_delta") for delta in deltas
            if (delta["world_size"], delta["stage"]) == (row["world_size"], row["stage"])
            and row["impl"] in (delta["impl"], delta["baseline"])]
    return None if not gaps or None in gaps else max(gaps)


def environment(site_dir: Path | None) -> dict[str, str]:
    """The checkout (and the installed wheels) first on every process's import path."""
    paths = [str(REPO), *([str(site_dir)] if site_dir else []), os.environ.get("PYTHONPATH", "")]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(path for path in paths if path),
            "TORCH_EXTENSIONS_DIR": os.environ.get("TORCH_EXTENSIONS_DIR", str(REPO / ".torch_extensions"))}


def fail(message: str, code: int = 2) -> int:
    print(f"error: {message}", file=sys.stderr)
    return code


def run_check(args: argparse.Namespace) -> int:
    """Phases 2-4."""
    started = time.monotonic()
    missing = missing_modules()
    wheels = sorted(WHEEL_DIR.glob("*.whl"))
    print(f"missing here: {', '.join(missing) or 'nothing'}; carried wheels: {len(wheels)} in {WHEEL_DIR.name}/")
    problem = check_wheels(missing, wheels)
    install = install_command(sys.executable, wheels, SITE_DIR) if missing else None
    steps = plan(sys.executable, time.strftime("%Y%m%d-%H%M%S"))
    if args.dry_run:
        print(f"install: {shlex.join(install) if install else '(nothing to install)'}")
        for step in steps:
            env = " ".join(f"{name}={value}" for name, value in step.env.items())
            share = f"at most {step.share_s:g} s" if step.share_s else "the budget left"
            print(f"{step.label} ({share}): {env + ' ' if env else ''}{shlex.join(step.command)}")
        print(f"budget: {args.budget_s:g} s in all; a step past its share gets SIGTERM, then SIGKILL after {GRACE_S:g} s")
        print(f"ready: {'no: ' + problem if problem else 'yes, once a CUDA GPU is visible'}")
        return 0
    if problem:
        return fail(problem)
    import torch

    if not torch.cuda.is_available():
        return fail("torch sees no CUDA GPU here. Run make gpu-check on a machine with one")
    if install:
        subprocess.run(install, check=True)
    env = environment(SITE_DIR if install else None)
    sys.path[:0] = env["PYTHONPATH"].split(os.pathsep)[:2]  # this process reads the runs with zero-lab too
    exit_code, comparisons = 0, []
    for step in steps:
        left = args.budget_s - (time.monotonic() - started)
        if left < 30:
            print(f"gpu-check: no budget left for {step.label}", file=sys.stderr)
            exit_code = 3
            break
        print(f"\n== {step.label}: {shlex.join(step.command)}", flush=True)
        allowed = step_time_s(step, left)
        code, late = run_step(step.command, {**env, **step.env}, allowed)
        if late:
            print(f"gpu-check: {step.label} ran past its {allowed:.0f} s and was stopped", file=sys.stderr)
        exit_code = max(exit_code, 3 if late else code if code in (0, 1, 3) else 3)
        if step.compare_dir is not None and (step.compare_dir / "compare.json").is_file():
            comparisons.append(json.loads((step.compare_dir / "compare.json").read_text()))
    if comparisons:
        print("\ngpu-check (one GPU, qwen3-0.6b bf16; memory per rank):\n" + compact_table(comparisons))
    print(f"\ngpu-check: {time.monotonic() - started:.0f} s; reports {REPORT.parent.relative_to(REPO)}/gpu-check*.md")
    return exit_code


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true", help="print what is missing and the commands; run nothing")
    parser.add_argument("--build-wheels", action="store_true", help="Phase 1: fill .whl/ (where pip reaches PyPI)")
    parser.add_argument("--python-version", default="3.12", help="the GPU machine's Python, for --build-wheels")
    parser.add_argument("--budget-s", type=float, default=BUDGET_S, help="stop every step after this many seconds in all")
    args = parser.parse_args(argv)
    if args.build_wheels:
        versions = {name: importlib.metadata.version(name) for name in (*NEEDED.values(), *ALSO_CARRIED)}
        for command in wheel_build_commands(sys.executable, args.python_version, versions, WHEEL_DIR):
            subprocess.run(command, check=True)
        print(f"{len(list(WHEEL_DIR.glob('*.whl')))} wheels in {WHEEL_DIR}")
        return 0
    return run_check(args)


if __name__ == "__main__":
    sys.exit(main())
