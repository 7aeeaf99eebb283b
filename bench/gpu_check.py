"""GPU readiness in one command: on a machine with one CUDA GPU and a Python that has torch, install
what it lacks from wheels carried with the tree, then compare nano and official DeepSpeed on
qwen3-0.6b (bf16, one GPU, stages 1-3, 10 steps) and print the comparison and the predicted peaks.

    make gpu-wheels                  # here, where pip reaches PyPI: fill .whl/ (git-ignored, ~5 MB)
    make gpu-check                   # there: python3 bench/gpu_check.py
    python3 bench/gpu_check.py --dry-run    # the plan: what is missing, the commands; runs nothing

Phase 1 (`--build-wheels`, run with the venv that passes the tests): build official DeepSpeed's
         pure-Python wheel from its sdist (no op is compiled: DeepSpeed JIT-builds them where they
         run) and download the wheels of its and zero-lab's other missing needs, each at the
         version installed here, for the GPU machine's Python (`--python-version`, 3.12).
Phase 2: find which needed modules the machine's Python lacks; install every carried wheel into
         a folder of the checkout (`.gpu-site/`, git-ignored) with pip, offline, no dependencies;
         zero-lab itself runs from the checkout (PYTHONPATH), nothing is built.
Phase 3: `zero-lab compare` on the GPU (official DeepSpeed's FusedAdam JIT-builds into
         `.torch_extensions/` in its first run), then the predicted-vs-measured peak table of the
         same runs; the whole check stops after --budget-s seconds (450, under the 8-minute goal).
Exit codes: 0 fine; 1 a gate of the comparison failed (loss parity); 2 the machine is not ready
(no CUDA GPU, no wheels for what is missing; one `error:` line); 3 a run failed or the budget ran out.
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

REPO = Path(__file__).resolve().parents[1]
WHEEL_DIR = REPO / ".whl"
SITE_DIR = REPO / ".gpu-site"
RUN_DIR = REPO / "runs" / "gpu-check"
REPORT = REPO / "reports" / "gpu-check.md"
# Module -> distribution, for what a GPU machine with torch, transformers, typer, rich, pandas,
# matplotlib and psutil still lacks (KINDS.md lists what the nvidia-h200 image holds).
NEEDED = {"deepspeed": "deepspeed", "pydantic": "pydantic", "pydantic_core": "pydantic-core", "hjson": "hjson",
          "annotated_types": "annotated-types", "typing_inspection": "typing-inspection"}
# Installed with pydantic, which needs a newer one than some images hold.
ALSO_CARRIED = ("typing-extensions",)
SOURCE_BUILT = ("deepspeed",)  # published as an sdist only; its wheel is pure Python
WORKLOAD = ["--model", "qwen3-0.6b", "--dtype", "bfloat16", "--gpus", "1", "--device", "cuda", "--stages", "1,2,3",
            "--steps", "10", "--seq-len", "512", "--batch-size", "1"]


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


def compare_command(python: str, run_dir: Path, report: Path) -> list[str]:
    """Phase 3: the comparison, run from the checkout."""
    return [python, "-m", "zero_lab.cli.app", "compare", *WORKLOAD, "--out", str(run_dir.parent),
            "--name", run_dir.name, "--report", str(report), "--stall-timeout", "300"]


def environment(site_dir: Path | None) -> dict[str, str]:
    """The checkout (and the installed wheels) first on every process's import path."""
    paths = [str(REPO), *([str(site_dir)] if site_dir else []), os.environ.get("PYTHONPATH", "")]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(path for path in paths if path),
            "TORCH_EXTENSIONS_DIR": os.environ.get("TORCH_EXTENSIONS_DIR", str(REPO / ".torch_extensions"))}


def peak_table(compare_json: Path) -> str:
    """Phase 3: the runs' measured peak beside the prediction, as the report shows it."""
    from zero_lab.analysis.markdown import estimate_table, markdown_table

    return markdown_table(*estimate_table(json.loads(compare_json.read_text())["rows"]))


def fail(message: str, code: int = 2) -> int:
    print(f"error: {message}", file=sys.stderr)
    return code


def run_check(args: argparse.Namespace) -> int:
    """Phases 2-3."""
    started = time.monotonic()
    missing = missing_modules()
    wheels = sorted(WHEEL_DIR.glob("*.whl"))
    print(f"missing here: {', '.join(missing) or 'nothing'}; carried wheels: {len(wheels)} in {WHEEL_DIR.name}/")
    problem = check_wheels(missing, wheels)
    install = install_command(sys.executable, wheels, SITE_DIR) if missing else None
    run_dir = RUN_DIR.with_name(f"{RUN_DIR.name}-{time.strftime('%Y%m%d-%H%M%S')}")
    compare = compare_command(sys.executable, run_dir, REPORT)
    if args.dry_run:
        for label, command in (("install", install), ("compare", compare)):
            print(f"{label}: {shlex.join(command) if command else '(nothing to install)'}")
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
    try:
        done = subprocess.run(compare, env=env, cwd=REPO, timeout=max(1.0, args.budget_s - (time.monotonic() - started)))
    except subprocess.TimeoutExpired:
        return fail(f"the comparison ran past the {args.budget_s:g} s budget; its runs so far are in {run_dir}", 3)
    if (run_dir / "compare.json").is_file():
        print("\npredicted vs measured peak (per rank):\n" + peak_table(run_dir / "compare.json"))
    print(f"\ngpu-check: {time.monotonic() - started:.0f} s; report {REPORT.relative_to(REPO)}, runs {run_dir}")
    return done.returncode


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true", help="print what is missing and the commands; run nothing")
    parser.add_argument("--build-wheels", action="store_true", help="Phase 1: fill .whl/ (where pip reaches PyPI)")
    parser.add_argument("--python-version", default="3.12", help="the GPU machine's Python, for --build-wheels")
    parser.add_argument("--budget-s", type=float, default=450.0, help="stop the comparison after this many seconds")
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
