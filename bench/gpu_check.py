"""GPU readiness in one command: on a machine with one CUDA GPU and a Python that has torch, install
what it lacks from wheels carried with the tree, run the GPU tests, then compare nano and official
DeepSpeed and FSDP2 on qwen3-0.6b (bf16, one GPU) and print one compact table to paste.

    make gpu-wheels                  # here, where pip reaches PyPI: fill .whl/ (git-ignored, ~6 MB)
    make gpu-check                   # there: python3 bench/gpu_check.py
    python3 bench/gpu_check.py --dry-run    # the plan and its budget: what is missing, the commands; runs nothing
    python3 bench/gpu_check.py --only three-way    # a rerun of one step (gpu-tests, three-way, offload)
    python3 bench/gpu_check.py --only muon    # opt-in, not in the default plan: Muon, nano and official

Phase 1 (`--build-wheels`, run with the venv that passes the tests; bench/gpu_wheels.py): build
         official DeepSpeed's pure-Python wheel from its sdist (no op is compiled: DeepSpeed
         JIT-builds them where they run) and download the wheels of its and zero-lab's other
         missing needs (pytest too), each at the version installed here, for the GPU machine's
         Python (`--python-version`, 3.12).
Phase 2 (bench/gpu_wheels.py): find which needed modules the machine's Python lacks; install the
         carried wheels of those distributions alone (one the machine has, pytest say, would
         shadow its own while its plugins still load) into a folder of the checkout
         (`.gpu-site/`, git-ignored) with pip, offline, no dependencies; zero-lab itself runs
         from the checkout (PYTHONPATH).
Phase 3: official DeepSpeed's FusedAdam JIT-builds in the background from here on (about a minute
         of nvcc, where nvcc, ninja and CUDA_HOME exist), beside the GPU tests, so no comparison
         waits for it; then the steps of `plan`, one after another, each within its share:
         `pytest -m gpu tests/gpu` (parity at W=1 through NCCL at stages 0-3, stage 3 sharded,
         exact bytes at phase boundaries, offload with pinned memory, zero.Init, FSDP2 on CUDA),
         the three-way `zero-lab compare --impls nano,official,fsdp2` at stages 2 and 3 (FSDP2
         has no stage 1), then nano and official with the optimizer offloaded, pinned and
         overlapped (`offload_overlap.json`) at stages 2 and 3 (with `--only muon`, opt-in: nano and
         official with `--optimizer muon` in fp32 at stages 1-3). The comparisons run with
         ZERO_LAB_COLLECTIVES_AT_WORLD_ONE=1, so nano's every collective goes through NCCL on the
         one GPU (FSDP2 at world size 1 copies instead of communicating: torch's own shortcut, so
         its comm MB are 0). Without the toolkit official runs torch's AdamW (the table's
         `optimizer` column says which); if the build fails, the three-way runs without official.
Phase 4: one table of every run (optimizer, memory, peak, step time, the largest loss delta of its
         impl against any other of its cell, predicted against measured peak, the host's
         predicted share), then the seconds each step and each run took beside the plan's
         estimates (also `reports/gpu-check-timings.json`), so the next plan can use them.
The budget (`budget_lines`, printed by --dry-run): the estimates in ESTIMATE_S, before any GPU run
measured them, add up to a plan inside --budget-s (540 s), itself inside the device tool's one
10-minute command; FusedAdam's build is counted in that plan and runs beside the GPU tests. A step
past its share is stopped as a user would stop it: SIGTERM first (the CLI then stops its torchrun,
whose ranks follow, and writes what it measured), SIGKILL only after a grace period; the CLI's
torchrun also dies with the CLI (a parent-death signal), so no rank keeps the GPU.
Exit codes: 0 fine; 1 a gate failed (a GPU test, loss parity); 2 the machine is not ready (no CUDA
GPU, no wheels for what is missing; one `error:` line); 3 a run or the build failed, or the
budget ran out.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import NamedTuple

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/: loaded by the tests as well as run
from gpu_wheels import (ALSO_CARRIED, NEEDED, REPO, SITE_DIR, WHEEL_DIR, check_wheels,  # noqa: E402, F401
                        install_command, missing_modules, wheel_build_commands, wheels_to_install)

RUN_DIR = REPO / "runs" / "gpu-check"
REPORT = REPO / "reports" / "gpu-check.md"
TIMINGS = REPO / "reports" / "gpu-check-timings.json"
OFFLOAD_CONFIG = REPO / "zero_lab" / "harness" / "configs" / "offload_overlap.json"
WORKLOAD = ["--model", "qwen3-0.6b", "--dtype", "bfloat16", "--gpus", "1", "--device", "cuda", "--stages", "2,3",
            "--impls", "nano,official,fsdp2", "--steps", "10", "--seq-len", "512", "--batch-size", "1"]
# Host Adam: fewer steps. nano and official only: FSDP2's CPUOffloadPolicy moves parameters and
# gradients to the host too, a different workload. The config overlaps the reduction with the
# backward and pins the host's tensors, so nano's queued device-to-host copies run (docs/gpu.md).
OFFLOAD_WORKLOAD = {"--stages": "2,3", "--steps": "3", "--offload": "optimizer", "--impls": "nano,official",
                    "--config": str(OFFLOAD_CONFIG)}
# What official DeepSpeed's first CUDA run would build, built ahead (a no-op where it is built or prebuilt).
FUSED_ADAM_BUILD = "from deepspeed.ops.op_builder import FusedAdamBuilder; FusedAdamBuilder().load(verbose=True)"
COMMAND_LIMIT_S = 600.0  # the device tool's one command
BUDGET_S = 540.0  # gpu-check's own: the command's limit less its start and the copying back
GRACE_S = 45.0  # after SIGTERM: the CLI stops torchrun and writes its summaries
MARGIN = 1.5  # a step's share: its estimate and half again (the last step: whatever is left)
# Seconds on the GPU machine (one H200, 16 cores), estimated before any GPU run (each run prints
# what it measured, for these to be replaced). A qwen3-0.6b launch's start was measured on a
# 2-core CPU machine: torch 5 s and transformers 13 s to import, the model 42 s to build on 2
# threads; on 16 cores the build runs about 7 times faster, and DeepSpeed's import adds some 5 s.
ESTIMATE_S = {
    "install": 15.0,  # pip, offline, the missing distributions' wheels
    "fused-adam": 75.0,  # nvcc and ninja on FusedAdam's two sources, for one GPU architecture
    "gpu-tests": 45.0,  # imports, NCCL's start, about twenty small tests
    "comparison": 20.0,  # one compare's own: the CLI, the preflight's child, configs, the report's plots
    "run-start": 30.0,  # one qwen3-0.6b launch to its first step: torchrun, imports, the model, the engine
    "step": 0.5,  # one bf16 step of qwen3-0.6b at 512 tokens, the phase samples' waits included
    "offload-step": 5.0,  # the same with Adam on the host: 596M fp32 parameters on 16 cores
}
STEPS = ("gpu-tests", "three-way", "offload")
# Steps only `--only` runs (not in the default plan): Muon side by side, nano and official (docs/muon.md).
OPT_IN_STEPS = ("muon",)
# fp32, so that both engines orthogonalise the same gradients; official's Newton-Schulz runs eagerly
# (TORCHDYNAMO_DISABLE), as on CPU, so no compile eats the budget.
MUON_WORKLOAD = {"--stages": "1,2,3", "--steps": "5", "--impls": "nano,official", "--dtype": "float32",
                 "--optimizer": "muon"}


class Step(NamedTuple):
    """One command of Phase 3: `estimate_s` by the plan, stopped after `share_s` seconds (None:
    whatever budget is left)."""

    label: str
    command: list[str]
    env: dict[str, str] = {}
    estimate_s: float = 0.0
    share_s: float | None = None
    compare_dir: Path | None = None  # a comparison's run directory (its compare.json feeds the table)


def compare_command(python: str, run_dir: Path, report: Path, overrides: dict[str, str] | None = None) -> list[str]:
    """Phase 3: a comparison of the issue's workload (flags in `overrides` replaced or added), run
    from the checkout."""
    flags = dict(zip(WORKLOAD[::2], WORKLOAD[1::2])) | (overrides or {})
    return [python, "-m", "zero_lab.cli.app", "compare", *[part for pair in flags.items() for part in pair],
            "--out", str(run_dir.parent), "--name", run_dir.name, "--report", str(report), "--stall-timeout", "300"]


def comparison_estimate(command: list[str]) -> float:
    """A comparison's seconds by ESTIMATE_S: its own, then per run a start and its steps."""
    flags = dict(zip(command[4::2], command[5::2]))
    runs = len(flags["--impls"].split(",")) * len(flags["--stages"].split(","))
    step = ESTIMATE_S["offload-step" if flags.get("--offload", "none") != "none" else "step"]
    return ESTIMATE_S["comparison"] + runs * (ESTIMATE_S["run-start"] + int(flags["--steps"]) * step)


def plan(python: str, stamp: str, only: tuple[str, ...] = STEPS) -> list[Step]:
    """Phase 3's steps, in order (those of `only`): the GPU tests, the three-way comparison, nano
    and official with offload; each with its estimate and share."""
    at_world_one = {"ZERO_LAB_COLLECTIVES_AT_WORLD_ONE": "1"}
    compare_dir = RUN_DIR.with_name(f"{RUN_DIR.name}-{stamp}")
    offload_dir = RUN_DIR.with_name(f"{RUN_DIR.name}-offload-{stamp}")
    three_way = compare_command(python, compare_dir, REPORT)
    offload = compare_command(python, offload_dir, REPORT.with_name("gpu-check-offload.md"), OFFLOAD_WORKLOAD)
    # The machine's own pytest, none of its plugins: the tests need none, and one of another
    # pytest's version would break the run.
    tests = Step("gpu-tests", [python, "-m", "pytest", "-q", "-m", "gpu", "-p", "no:cacheprovider", "tests/gpu"],
                 {"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}, ESTIMATE_S["gpu-tests"])
    steps = [tests, Step("three-way", three_way, at_world_one, comparison_estimate(three_way), compare_dir=compare_dir),
             Step("offload", offload, at_world_one, comparison_estimate(offload), compare_dir=offload_dir)]
    if "muon" in only:
        muon_dir = RUN_DIR.with_name(f"{RUN_DIR.name}-muon-{stamp}")
        muon = compare_command(python, muon_dir, REPORT.with_name("gpu-check-muon.md"), MUON_WORKLOAD)
        steps.append(Step("muon", muon, at_world_one | {"TORCHDYNAMO_DISABLE": "1"}, comparison_estimate(muon),
                          compare_dir=muon_dir))
    chosen = [step for step in steps if step.label in only]
    return [step._replace(share_s=None if index == len(chosen) - 1 else MARGIN * step.estimate_s)
            for index, step in enumerate(chosen)]


def builds_fused_adam(steps: list[Step]) -> bool:
    """Whether a step of the plan runs official DeepSpeed on CUDA without offload (FusedAdam)."""
    return any("official" in dict(zip(step.command[4::2], step.command[5::2])).get("--impls", "").split(",")
               and "--offload" not in step.command for step in steps if step.compare_dir is not None)


def budget_lines(steps: list[Step], installs: bool, builds: bool, budget_s: float) -> list[str]:
    """The plan's seconds, step by step, and whether they fit: the budget, and the device tool's one
    command even if FusedAdam's build, which runs beside the GPU tests, overlapped nothing."""
    def line(label: str, seconds: float, note: str) -> str:
        return f"  {label:<11}{seconds:5.0f} s  {note}"

    lines, elapsed = [], ESTIMATE_S["install"] if installs else 0.0
    if installs:
        lines.append(line("install", elapsed, "(the missing distributions' wheels)"))
    built_at = elapsed + ESTIMATE_S["fused-adam"]
    if builds:
        lines.append(line("fused-adam", ESTIMATE_S["fused-adam"], f"(in the background from {elapsed:.0f} s: built "
                                                                   f"by {built_at:.0f} s)"))
    for step in steps:
        lines.append(line(step.label, step.estimate_s, f"(share {step.share_s:.0f} s)" if step.share_s
                          else "(share: what is left)"))
        if builds and step.label == "three-way":  # official is the second impl of each stage
            first = elapsed + ESTIMATE_S["comparison"] + ESTIMATE_S["run-start"] + 10 * ESTIMATE_S["step"]
            lines.append(f"  (its first official run starts at about {first:.0f} s, "
                         + ("the build done)" if first >= built_at else f"and waits {built_at - first:.0f} s for the build)"))
        elapsed += step.estimate_s
    serial = elapsed + (ESTIMATE_S["fused-adam"] if builds else 0.0)
    fits = elapsed <= budget_s and serial <= COMMAND_LIMIT_S
    lines.append(line("total", elapsed, f"of the {budget_s:.0f} s budget" + (
        f"; with FusedAdam's build overlapping nothing {serial:.0f} s, within the {COMMAND_LIMIT_S:.0f} s command"
        if builds else "") + f": {'fits' if fits else 'DOES NOT FIT'}"))
    return lines


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


class BackgroundBuild:
    """Phase 3: FusedAdam's JIT build in a process of its own, its output in `log`. torch's builder
    holds a lock file while it builds, and a run that needs the op waits on it; a builder stopped
    early would leave it, and every later build would wait forever, so a stale one goes first and
    one left by a builder stopped here goes after it."""

    def __init__(self, command: list[str], env: dict[str, str], log: Path, extensions_dir: Path):
        from zero_lab.launch.torchrun import child_dies_with_parent

        self.extensions_dir = extensions_dir
        self.clear_locks()
        self.log = log
        self.started = time.monotonic()
        with open(log, "w") as output:
            self.process = subprocess.Popen(command, env=env, cwd=REPO, stdout=output, stderr=subprocess.STDOUT,
                                            preexec_fn=child_dies_with_parent)
        self.seconds: float | None = None

    def clear_locks(self) -> None:
        for lock in self.extensions_dir.glob("*/fused_adam/lock"):
            lock.unlink(missing_ok=True)

    def seconds_taken(self) -> float:
        """The build's seconds: DeepSpeed's own count ("Time to load fused_adam op"), else so far."""
        found = re.search(r"Time to load fused_adam op: ([\d.]+) seconds", self.log.read_text(errors="replace"))
        return float(found.group(1)) if found else self.seconds or time.monotonic() - self.started

    def state(self) -> str:
        """"running", "built" or "failed"."""
        code = self.process.poll()
        if code is not None and self.seconds is None:
            self.seconds = time.monotonic() - self.started
        return "running" if code is None else "built" if code == 0 else "failed"

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            self.process.wait()
            self.clear_locks()

    def tail(self, lines: int = 5) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])


def without_official(step: Step) -> Step:
    """The three-way step without official, when its optimizer could not be built."""
    command = list(step.command)
    index = command.index("--impls") + 1
    command[index] = ",".join(impl for impl in command[index].split(",") if impl != "official")
    return step._replace(command=command)


def compact_table(comparisons: list[dict]) -> str:
    """Phase 4: a line per run of every comparison: its optimizer, memory, peak, step time, the
    largest step loss delta between its impl and any other of its cell (with two impls, the
    cell's one delta), the predicted peak against the measured one (on CUDA the device's bytes),
    and the host's predicted share (offload)."""
    from zero_lab.analysis.report.markdown import fmt, markdown_table, status_text

    headers = ["stage", "offload", "impl", "optimizer", "status", "alloc MB", "peak MB", "step ms",
               "max loss delta", "predicted peak MB", "peak error %", "predicted host MB"]
    body = []
    for comparison in comparisons:
        for row in comparison.get("rows", []):
            body.append([str(row["stage"]), row.get("offload") or "none", row["impl"], row.get("optimizer") or "-",
                         status_text(row), fmt(row.get("alloc_max_mb")), fmt(row.get("peak_alloc_max_mb")),
                         fmt(row.get("step_ms")), fmt(largest_loss_delta(comparison.get("deltas", []), row), 6),
                         fmt(row.get("predicted_peak_mb")), fmt(row.get("peak_error_pct"), 1, signed=True),
                         fmt(row.get("predicted_host_peak_mb"))])
    return markdown_table(headers, body)


def largest_loss_delta(deltas: list[dict], row: dict) -> float | None:
    """The largest max_step_loss_delta of the deltas of row's cell that row's impl takes part in
    (None when there is none, or one is NaN's null: a gap not known is not a small one)."""
    gaps = [delta.get("max_step_loss_delta") for delta in deltas
            if (delta["world_size"], delta["stage"]) == (row["world_size"], row["stage"])
            and row["impl"] in (delta["impl"], delta["baseline"])]
    return None if not gaps or None in gaps else max(gaps)


def timings(measured: dict[str, float], comparisons: dict[str, dict], steps: list[Step] = ()) -> dict:
    """Phase 4: the seconds each step took beside its estimate (a comparison's is the plan's, from
    its runs and steps), and each run's."""
    estimates = {**ESTIMATE_S, **{step.label: step.estimate_s for step in steps}}
    runs = {label: {f"{row['impl']} s{row['stage']}": row.get("duration_s") for row in comparison.get("rows", [])}
            for label, comparison in comparisons.items()}
    return {"steps": {label: {"measured_s": round(seconds, 1), "estimate_s": estimates.get(label)}
                      for label, seconds in measured.items()}, "runs": runs}


def environment(site_dir: Path | None) -> dict[str, str]:
    """The checkout (and the installed wheels) first on every process's import path."""
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    from zero_lab.workload.engines.cuda_toolkit import deepspeed_arch_list
    paths = [str(REPO), *([str(site_dir)] if site_dir else []), os.environ.get("PYTHONPATH", "")]
    # FusedAdam's background build and official's runs read one arch list, so the runs find the build.
    arch_list = ({"TORCH_CUDA_ARCH_LIST": deepspeed_arch_list(os.environ["TORCH_CUDA_ARCH_LIST"])}
                 if os.environ.get("TORCH_CUDA_ARCH_LIST") else {})
    return {**os.environ, **arch_list, "PYTHONPATH": os.pathsep.join(path for path in paths if path),
            "TORCH_EXTENSIONS_DIR": os.environ.get("TORCH_EXTENSIONS_DIR", str(REPO / ".torch_extensions")),
            "DS_ACCELERATOR": "cuda"}


def fail(message: str, code: int = 2) -> int:
    print(f"error: {message}", file=sys.stderr)
    return code


def toolkit_problems() -> list[str]:
    """What building FusedAdam lacks here (zero_lab.workload.engines.cuda_toolkit; importing no torch)."""
    sys.path.insert(0, str(REPO))
    from zero_lab.workload.engines.cuda_toolkit import toolkit_problems as problems

    return problems()


def dry_run(args: argparse.Namespace, missing: list[str], install: list[str] | None, steps: list[Step],
            problem: str | None) -> int:
    """The plan as the GPU machine will run it: its install (its Python lacks DeepSpeed), the build
    (its image has nvcc and ninja: KINDS.md), the steps and their budget."""
    print(f"install: {shlex.join(install) if install else '(nothing to install here)'}")
    builds = builds_fused_adam(steps)
    if builds:
        toolkit = toolkit_problems()
        print(f"fused-adam (in the background from the start): {shlex.join([sys.executable, '-c', FUSED_ADAM_BUILD])}"
              + (f" (not here: {'; '.join(toolkit)})" if toolkit else ""))
    for step in steps:
        env = " ".join(f"{name}={value}" for name, value in step.env.items())
        print(f"{step.label}: {env + ' ' if env else ''}{shlex.join(step.command)}")
    print("plan (seconds on one H200 with 16 cores; estimates until a run measures them):")
    print("\n".join(budget_lines(steps, bool(missing), builds, args.budget_s)))
    print(f"a step past its share gets SIGTERM, then SIGKILL after {GRACE_S:g} s; rerun one step with --only "
          f"{'|'.join(STEPS)}")
    print(f"ready: {'no: ' + problem if problem else 'yes, once a CUDA GPU is visible'}")
    return 0


def run_check(args: argparse.Namespace) -> int:
    """Phases 2-4."""
    started = time.monotonic()
    missing = missing_modules()
    wheels = sorted(WHEEL_DIR.glob("*.whl"))
    print(f"missing here: {', '.join(missing) or 'nothing'}; carried wheels: {len(wheels)} in {WHEEL_DIR.name}/")
    problem = check_wheels(missing, wheels)
    chosen = wheels_to_install(missing, wheels)
    install = install_command(sys.executable, chosen, SITE_DIR) if chosen else None
    stamp = time.strftime("%Y%m%d-%H%M%S")
    steps = plan(sys.executable, stamp, args.only)
    if args.dry_run:
        return dry_run(args, missing, install, steps, problem)
    if problem:
        return fail(problem)
    import torch

    if not torch.cuda.is_available():
        return fail("torch sees no CUDA GPU here. Run make gpu-check on a machine with one")
    measured: dict[str, float] = {}
    if install:
        subprocess.run(install, check=True)
        measured["install"] = time.monotonic() - started
    env = environment(SITE_DIR if install or SITE_DIR.is_dir() else None)
    sys.path[:0] = env["PYTHONPATH"].split(os.pathsep)[:2]  # this process reads the runs with zero-lab too
    RUN_DIR.parent.mkdir(parents=True, exist_ok=True)
    toolkit = toolkit_problems()
    builds = builds_fused_adam(steps) and not toolkit
    build = BackgroundBuild([sys.executable, "-c", FUSED_ADAM_BUILD], env, RUN_DIR.with_name(f"gpu-check-{stamp}-fused-adam.log"),
                            Path(env["TORCH_EXTENSIONS_DIR"])) if builds else None
    if toolkit and builds_fused_adam(steps):
        print(f"fused-adam: not built ({'; '.join(toolkit)}): official runs torch.optim.AdamW")
    exit_code, comparisons = 0, {}
    try:
        for step in steps:
            if step.label == "three-way" and build is not None and build.state() == "failed":
                print(f"gpu-check: FusedAdam failed to build (log {build.log}); the three-way runs without official:\n"
                      f"{build.tail()}", file=sys.stderr)
                step, exit_code = without_official(step), 3
            left = args.budget_s - (time.monotonic() - started)
            if left < 30:
                print(f"gpu-check: no budget left for {step.label}", file=sys.stderr)
                exit_code = 3
                break
            print(f"\n== {step.label}: {shlex.join(step.command)}", flush=True)
            allowed, step_started = step_time_s(step, left), time.monotonic()
            code, late = run_step(step.command, {**env, **step.env}, allowed)
            measured[step.label] = time.monotonic() - step_started
            if late:
                print(f"gpu-check: {step.label} ran past its {allowed:.0f} s and was stopped", file=sys.stderr)
            exit_code = max(exit_code, 3 if late else code if code in (0, 1, 3) else 3)
            if step.compare_dir is not None and (step.compare_dir / "compare.json").is_file():
                comparisons[step.label] = json.loads((step.compare_dir / "compare.json").read_text())
    finally:
        if build is not None:
            if build.state() == "running":
                build.stop()
            measured["fused-adam"] = build.seconds_taken()
    if comparisons:
        dtypes = "fp32" if set(comparisons) == {"muon"} else "bf16" if "muon" not in comparisons else "bf16, muon fp32"
        print(f"\ngpu-check (one GPU, qwen3-0.6b {dtypes}; memory per rank):\n" + compact_table(list(comparisons.values())))
    report = timings(measured, comparisons, steps)
    TIMINGS.parent.mkdir(parents=True, exist_ok=True)
    TIMINGS.write_text(json.dumps(report, indent=1) + "\n")
    print("\nseconds measured (estimate): " + ", ".join(f"{label} {figures['measured_s']:.0f} ({figures['estimate_s']})"
                                                       for label, figures in report["steps"].items()))
    print(f"gpu-check: {time.monotonic() - started:.0f} s; reports {REPORT.parent.relative_to(REPO)}/gpu-check*")
    return exit_code


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true", help="print what is missing, the commands and the plan's "
                                                               "budget; run nothing")
    parser.add_argument("--build-wheels", action="store_true", help="Phase 1: fill .whl/ (where pip reaches PyPI)")
    parser.add_argument("--python-version", default="3.12", help="the GPU machine's Python, for --build-wheels")
    parser.add_argument("--budget-s", type=float, default=BUDGET_S, help="stop every step after this many seconds in all")
    parser.add_argument("--only", default=",".join(STEPS), help=f"the steps to run, of {','.join(STEPS)} (a rerun), "
                        f"or the opt-in {','.join(OPT_IN_STEPS)}")
    args = parser.parse_args(argv)
    args.only = tuple(label.strip() for label in args.only.split(",") if label.strip())
    unknown = [label for label in args.only if label not in STEPS + OPT_IN_STEPS]
    if unknown or not args.only:
        return fail(f"--only {','.join(unknown) or '(none)'} is not a step. Pick from {','.join(STEPS)} "
                    f"(opt-in: {','.join(OPT_IN_STEPS)})")
    if args.build_wheels:
        versions = {name: importlib.metadata.version(name) for name in (*NEEDED.values(), *ALSO_CARRIED)}
        for command in wheel_build_commands(sys.executable, args.python_version, versions, WHEEL_DIR):
            subprocess.run(command, check=True)
        print(f"{len(list(WHEEL_DIR.glob('*.whl')))} wheels in {WHEEL_DIR}")
        return 0
    return run_check(args)


if __name__ == "__main__":
    sys.exit(main())
