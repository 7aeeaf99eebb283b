"""Prepare every run of a command up front (so bad input stops all before any launch), then run them.

Phase 1: `prepare` gives each (impl, stage, world size) its config, the official conversion (which
         validates the config as nano does) and a launch spec (its port is picked when it starts).
Phase 2: `run_jobs` runs them one after another under one progress display; a failed run does
         not stop the others; Ctrl-C, SIGTERM or SIGHUP stops the current one and skips the rest.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from zero_lab import signals
from zero_lab.analysis.runs import rundir
from zero_lab.cli import input_checks, output
from zero_lab.cli.errors import BadInput
from zero_lab.launch import torchrun
from zero_lab.workload.nodes import RANKS_PER_NODE_FIX, ranks_per_node_problem


@dataclass
class Job:
    """One prepared run: its launch, directory, the configs each engine receives, a display label."""

    spec: torchrun.LaunchSpec
    run_dir: Path
    config: dict
    official_config: dict | None
    label: str


@dataclass
class SharedSettings:
    """What every job of one command shares (config_path None: the harness's per-stage default;
    stall_timeout_s 0: no stall watch; device_memory_gb: --device-memory, None when not stated)."""

    config_path: Path | None
    device: str
    workload: torchrun.Workload
    multi_node: torchrun.MultiNode
    extra_torchrun_args: list[str]
    stall_timeout_s: float = 0.0
    device_memory_gb: float | None = None
    script: torchrun.UserScript | None = None  # compare --script: the user's script trains, not the harness
    max_restarts: int = 0  # torchrun --max-restarts (docs/restarts.md)
    own_engines: dict[str, Path] | None = None  # --impl(s) NAME=PATH: each own engine's name and path


def check(shared: SharedSettings, impls: list[str], world_sizes: list[int]) -> None:
    """Before any config is read: known impls, processes the device can hold, a workload the harness accepts."""
    input_checks.check_impls([impl for impl in impls if impl not in (shared.own_engines or {})])
    check_own_engines(shared, impls)
    if "fsdp2" in impls and shared.script is not None:
        raise BadInput("--impl fsdp2 runs the built-in workload only (a script's `import deepspeed` cannot be FSDP2)",
                       "drop fsdp2 from the impls, or drop --script")
    for world_size in world_sizes:
        problem = ranks_per_node_problem(shared.workload.ranks_per_node,
                                         shared.multi_node.world_size(world_size) or world_size)
        if problem:
            raise BadInput(problem, RANKS_PER_NODE_FIX)
    for world_size in world_sizes:
        input_checks.check_processes(world_size, shared.device, shared.multi_node)
    input_checks.check_workload(shared.workload, shared.device, impls, model_and_data=shared.script is None)


def check_own_engines(shared: SharedSettings, impls: list[str]) -> None:
    """Own engines (--impl NAME=PATH) run the built-in workload, without DeepSpeed checkpoints."""
    own = [impl for impl in impls if impl in (shared.own_engines or {})]
    if own and shared.script is not None:
        raise BadInput(f"own engine {own[0]} runs the built-in workload only (a script imports deepspeed itself)",
                       "drop it from the impls, or drop --script")
    if own and (shared.workload.save_dir or shared.workload.resume):
        raise BadInput(f"checkpoints (--save-dir, --resume, --resume-check) are not part of own engine {own[0]}",
                       "drop them, or drop it from the impls")


def split_by_visible_gpus(shared: SharedSettings, world_sizes: list[int]) -> tuple[list[int], dict[int, str]]:
    """On CUDA, the world sizes each of whose ranks on this node has a visible GPU, and for the
    others why not ("needs 2 GPUs (1 visible)"); on CPU every one. When no world size has its
    GPUs, all come back, for `check` to refuse them in one line."""
    if shared.device != "cuda":
        return world_sizes, {}
    from zero_lab.cli.environment import cuda_devices

    visible = len(cuda_devices())
    lacking = {size: f"needs {size} GPUs ({visible} visible)" for size in world_sizes if size > visible}
    if len(lacking) == len(world_sizes):
        return world_sizes, {}
    return [size for size in world_sizes if size not in lacking], lacking


def not_run(shared: SharedSettings, lacking: dict[int, str], stages: list[int], impls: list[str]) -> list[dict]:
    """A row for every cell of the world sizes `split_by_visible_gpus` left out, saying why."""
    return [rundir.not_run_summary(shared.multi_node.world_size(size) or size, stage, impl, reason)
            for size, reason in lacking.items() for stage in stages for impl in impls]


def prepare(shared: SharedSettings, impl: str, stage: int, nproc: int, run_dir: Path, steps: int | None = None,
            note: str | None = None) -> Job:
    """Phase 1 for one run: the config as the harness will build it, validated, and its launch
    (`steps` overrides the workload's; `note` labels it, "warm-up" when `steps` is given)."""
    source = shared.config_path or input_checks.default_config_path(stage)
    staged = input_checks.config_for_stage(input_checks.load_config_file(source), stage)
    spec = input_checks.make_spec(impl, stage, nproc, shared.device, run_dir, shared.workload, shared.multi_node,
                          shared.extra_torchrun_args, steps=steps, stall_timeout_s=shared.stall_timeout_s,
                          host_memory_limit=host_memory_limit(shared), script=shared.script)
    spec = with_restarts(spec, shared.max_restarts, run_dir)
    spec = with_elastic_global_batch(spec, staged, source)
    spec.engine_path = (shared.own_engines or {}).get(impl)
    config = input_checks.received_config(staged, spec, source)
    official = input_checks.official_config(config, "cuda" if shared.device == "cuda" else "cpu") if impl == "official" else None
    world_size = shared.multi_node.world_size(nproc) or nproc
    if impl == "fsdp2":  # stages 0/1 and fp16 stop here, before any launch
        input_checks.fsdp2_plan(config, world_size, source)
    note = note or ("warm-up" if steps is not None else None)
    label = f"{impl} w{world_size} s{stage}" + (f" ({note})" if note else "")
    return Job(spec, run_dir, config, official, label)


def restart_from_the_start_note(shared: SharedSettings, fix: str) -> str | None:
    """With --max-restarts and no checkpoint saved during the run, a restarted group trains again from
    where the run started: said once at launch (None when it will resume, or a user's script, which
    saves its own checkpoints, runs)."""
    if not shared.max_restarts or shared.workload.save_every or shared.script is not None:
        return None
    return (f"note: --max-restarts {shared.max_restarts} with no checkpoint saved during the run: a restarted "
            f"group trains again from where the run started; {fix} to resume where it stopped")


def with_restarts(spec: torchrun.LaunchSpec, max_restarts: int, run_dir: Path) -> torchrun.LaunchSpec:
    """The launch with torchrun's --max-restarts; a run that saves every K steps without a --save-dir of
    its own (compare's cells) keeps its checkpoints in <run_dir>/checkpoints, where a restart resumes."""
    if not max_restarts:
        return spec
    workload = spec.workload
    if workload.save_every and not workload.save_dir:
        workload = replace(workload, save_dir=str((run_dir / "checkpoints").resolve()))
    return replace(spec, workload=workload, max_restarts=max_restarts)


def with_elastic_global_batch(spec: torchrun.LaunchSpec, staged: dict, source: Path) -> torchrun.LaunchSpec:
    """With --max-restarts and an elastic range `--nnodes MIN:MAX`, a restart may come back with fewer
    nodes: the global batch stays the one of MAX nodes (the harness's --global-batch-size), each rank
    accumulating more micro-steps. BadInput when some node count in the range cannot split it evenly,
    or for official DeepSpeed, which cannot load a checkpoint saved at another world size."""
    low, _, high = (spec.multi_node.nnodes or "1").partition(":")
    if not spec.max_restarts or not high or low == high:
        return spec
    if not (low.isdigit() and high.isdigit() and 1 <= int(low) <= int(high)):
        raise BadInput(f"--nnodes {spec.multi_node.nnodes} is not an elastic range MIN:MAX", "give e.g. --nnodes 1:2")
    if spec.impl != "nano":
        raise BadInput(f"--impl {spec.impl} cannot resume a checkpoint at another world size, as a restart with "
                       f"fewer nodes of --nnodes {spec.multi_node.nnodes} would", "use --impl nano, or a fixed --nnodes")
    micro = spec.workload.batch_size or int(staged.get("train_micro_batch_size_per_gpu") or 1)
    per_rank = micro * int(staged.get("gradient_accumulation_steps") or 1)
    global_batch = per_rank * spec.nproc * int(high)
    uneven = [nodes for nodes in range(int(low), int(high) + 1) if global_batch % (micro * spec.nproc * nodes)]
    if uneven:
        raise BadInput(f"the global batch of {high} nodes ({global_batch} samples, from {source}) does not split "
                       f"into whole micro-batches on {uneven[0]} node(s)", "pick a --nnodes range or a batch size "
                       "whose node counts all divide it")
    return replace(spec, workload=replace(spec.workload, global_batch_size=global_batch))


# ZeRO++ keys official DeepSpeed 0.19.8 accepts but cannot run on CPU: their quantizer kernels are
# CUDA only ("This op had not been implemented on CPU backend"); docs/zeropp.md.
OFFICIAL_CUDA_ONLY_KEYS = ("zero_quantized_weights", "zero_quantized_gradients")


def official_cannot_run(config: dict, device: str) -> str | None:
    """Why official DeepSpeed cannot run `config` on `device` (None: it can), in one line."""
    zero = config.get("zero_optimization") or {}
    keys = [key for key in OFFICIAL_CUDA_ONLY_KEYS if zero.get(key)]
    if device != "cpu" or not keys:
        return None
    return (f"official DeepSpeed cannot run {' and '.join(keys)} on CPU (its quantizer: \"This op had not been "
            "implemented on CPU backend\")")


def impls_that_can_run(shared: SharedSettings, impls: list[str]) -> list[str]:
    """The impls without official when it cannot run the config on this device (one line on stderr
    says so); with only official asked for, that line is bad input."""
    if "official" not in impls:
        return impls
    config = input_checks.load_config_file(shared.config_path) if shared.config_path else {}
    reason = official_cannot_run(config, shared.device)
    if reason is None:
        return impls
    remaining = [impl for impl in impls if impl != "official"]
    if not remaining:
        raise BadInput(reason, "add nano to --impls, or run on --device cuda")
    output.stderr.print(f"note: {reason}; running {' and '.join(remaining)} alone", markup=False, highlight=False)
    return remaining


def warn_passed_to_official(prepared: list[Job]) -> None:
    """One `warning:` line per distinct set of keys only official DeepSpeed knows that `--impl
    official` passes through (each run's log says it again in a `[warn] kind=config` line)."""
    from zero_lab.workload.run_config import passed_to_official

    messages = {passed_to_official(job.spec.impl, job.config) for job in prepared} - {None}
    for message in sorted(messages):
        output.stderr.print(f"warning: {message}", markup=False, highlight=False)


def host_memory_limit(shared: SharedSettings) -> int | None:
    """On CPU --device-memory is the host's: the memory watch's limit for the ranks (bytes)."""
    if shared.device != "cpu" or shared.device_memory_gb is None:
        return None
    return int(shared.device_memory_gb * 2**30)


def resume_pair(shared: Launch, impl: str, stage: int, nproc: int, directory: Path) -> list[Job]:
    """`compare --resume-check` for one cell: train half the steps and save, then resume to the end."""
    saved_at = max(1, shared.workload.steps // 2)
    checkpoints = str((directory / "checkpoints").resolve())
    first = replace(shared, workload=replace(shared.workload, save_dir=checkpoints))
    second = replace(shared, workload=replace(shared.workload, save_dir=checkpoints, resume="latest"))
    return [prepare(first, impl, stage, nproc, directory / "first", steps=saved_at, note=f"saves at {saved_at}"),
            prepare(second, impl, stage, nproc, directory / "resumed", note=f"resumes at {saved_at}")]


def run_jobs(jobs: list[Job], environment: dict) -> tuple[list[dict], str | None]:
    """Phase 2: (summaries of the runs that started, the signal that cut the sequence short or None).

    On a terminal a live bar per run; elsewhere (CI logs) one line as each run starts and ends.
    """
    from zero_lab.launch import torchrun_job  # psutil and process control: only when runs start

    summaries = []
    live = output.stderr.is_terminal
    with output.progress_bar(disable=not live) as progress:
        for job in jobs:
            if not live:
                what = f"{job.spec.workload.steps} steps" if job.spec.script is None else job.spec.script.path.name
                output.stderr.print(f"{job.label}: running {what} in {job.run_dir}", markup=False)
            try:
                summary = torchrun_job.execute(job.spec, job.run_dir, job.config, job.official_config, environment,
                                               job.label, progress if live else None)
            except signals.INTERRUPTS as interrupt:
                if (job.run_dir / rundir.SUMMARY).is_file():  # absent if the signal came before the launch
                    summaries.append(rundir.read_json(job.run_dir / rundir.SUMMARY))
                return summaries, signals.signal_name(interrupt)
            summaries.append(summary)
            output.stderr.print(f"{job.label}: {summary['status']}, {summary['steps']} steps, last loss "
                                f"{summary['loss_last']}, {summary['duration_s']} s", markup=False)
    return summaries, None
