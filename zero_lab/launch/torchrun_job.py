"""Run one torchrun job into a run directory, with live progress and a clean stop.

Phase 1: write what the run is given (command, configs, environment) before it starts.
Phase 2: pick a free port, then at once start torchrun in its own session (a port picked earlier
         could have been taken by a concurrent comparison), with stop signals deferred until its
         process is known (zero_lab.launch.signals.deferred). Stream rank 0's output: to
         console.log, and each `[opt_step k]` line to the progress bar with its loss, and to the stall watch
         (zero_lab.launch.stall), which stops the run when no step comes for --stall-timeout seconds.
         The memory watch (zero_lab.launch.memory_watch) samples every rank's resident memory.
Phase 3: on Ctrl-C, SIGTERM or SIGHUP (zero_lab.launch.signals), stop torchrun's process group and
         every worker's (torchrun starts each worker in a session of its own), SIGTERM then
         SIGKILL, within seconds.
Phase 4: gather every rank's log, parse rank 0's, and write metrics.csv and summary.json - also
         for a failed or interrupted run, so its partial results stay; a rank that ran out of
         memory is named with the figures (`failure: out_of_memory`).
Phases 3 and 4 run with those signals held off, so a second one cannot cut them short.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import psutil
from rich.progress import Progress

from zero_lab.analysis import rundir
from zero_lab.analysis.logparse import is_number, parse_file, step_and_loss
from zero_lab.analysis.peak_memory import error_percent, predict_run_peak
from zero_lab.analysis.step_phases import last_step_phases
from zero_lab.launch import moments, ports, signals, torchrun
from zero_lab.launch.engine_switch import impl_environment
from zero_lab.launch.memory_watch import MemoryWatch
from zero_lab.launch.stall import StallWatch
from zero_lab.nano.dtypes import PRECISION_OF_DTYPE_NAME
from zero_lab.workload.log_lines import MB
from zero_lab.workload.out_of_memory import EXIT_OUT_OF_MEMORY, MESSAGE_PREFIX

STOP_GRACE_S = 5.0


def stop_process_tree(process: subprocess.Popen) -> None:
    """SIGTERM the process groups of torchrun and all its descendants (with SIGCONT, so a stopped
    one acts on it), then SIGKILL what is left."""
    try:
        members = [psutil.Process(process.pid), *psutil.Process(process.pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return
    groups = set()
    for member in members:
        try:
            groups.add(os.getpgid(member.pid))
        except ProcessLookupError:
            pass
    for signals_now in ((signal.SIGTERM, signal.SIGCONT), (signal.SIGKILL,)):
        for group in groups:
            for sig in signals_now:
                try:
                    os.killpg(group, sig)
                except ProcessLookupError:
                    pass
        _, alive = psutil.wait_procs(members, timeout=STOP_GRACE_S)
        if not alive:
            break
    process.wait()


def stream(process: subprocess.Popen, console_log: Path, progress: Progress | None, task,
           on_step: Callable[[int], None]) -> None:
    with open(console_log, "w", buffering=1) as sink:  # line by line, so console.log can be followed live
        for line in process.stdout:
            sink.write(line)
            found = step_and_loss(line)
            if found is None:
                continue
            step, loss = found
            on_step(step)
            if progress is not None:
                loss_text = f"{loss:.4f}" if loss is not None else "?"
                progress.update(task, completed=step, loss=loss_text)
    process.wait()


def harness_line(rank_logs: list[Path], prefix: str, rank: int | None = None) -> str | None:
    """The last line starting with prefix in the first rank stderr log that has one (rank's own first)."""
    for path in sorted(rank_logs, key=lambda path: (not path.name.startswith(f"rank{rank}."), path.name)):
        if path.name.endswith(".stderr.log"):
            lines = [line for line in path.read_text(errors="replace").splitlines() if line.startswith(prefix)]
            if lines:
                return lines[-1]
    return None


def bad_input_message(rank_logs: list[Path], rank_exit_code: int | None) -> str | None:
    """The harness's own one-line `error: ...` when it refused its input (exit code 2)."""
    if rank_exit_code != 2:
        return None
    line = harness_line(rank_logs, "error:")
    return line.removeprefix("error:").strip() if line else None


def out_of_memory_message(rank_logs: list[Path], failure: dict, memory: MemoryWatch | None) -> str | None:
    """Why a rank ran out of memory: the harness's own `out of memory: ...` line (exit code
    EXIT_OUT_OF_MEMORY: the allocator refused), or the memory watch's verdict on a rank killed by SIGKILL."""
    if failure["rank_exit_code"] == EXIT_OUT_OF_MEMORY:
        return harness_line(rank_logs, MESSAGE_PREFIX, failure["failed_rank"])
    return memory.out_of_memory(failure["failed_rank"], failure["rank_exit_code"]) if memory is not None else None


def execute(
    spec: torchrun.LaunchSpec,
    run_dir: Path,
    config: dict,
    official_config: dict | None,
    environment: dict,
    label: str,
    progress: Progress | None = None,
) -> dict:
    """Run spec to completion and return its summary; an interruption (signals.INTERRUPTS) is
    re-raised once the run is stopped and its summary written."""
    # Phase 1
    run_dir.mkdir(parents=True, exist_ok=True)
    rundir.write_json(spec.config_path, config)
    if official_config is not None:
        rundir.write_json(run_dir / "config.official.json", official_config)
    rundir.write_json(run_dir / "env.json", environment)
    child_env = torchrun.launch_environment(dict(os.environ), spec.device, spec.nproc, environment["cpu_cores"])
    if spec.script is not None:  # its `import deepspeed` is the impl's, and the engine prints the log contract
        child_env = impl_environment(child_env, spec.impl, spec.device, log_contract=True)
    total_steps = spec.workload.steps if spec.script is None else None  # a script decides its own
    task = progress.add_task(label, total=total_steps, loss="-") if progress is not None else None
    # Phase 2
    if not spec.multi_node.enabled:
        spec = dataclasses.replace(spec, port=ports.free_port())
    command = torchrun.torchrun_command(spec)
    (run_dir / "command.txt").write_text(torchrun.shell_quote(command) + "\n")
    (run_dir / "console.log").touch()  # a stop before the first line still finds it
    started = time.monotonic()
    process = watch = memory = interrupt = None
    try:
        moments.reached("launching")
        with signals.deferred():  # a stop that lands while torchrun starts acts once it is known
            process = subprocess.Popen(
                command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace",
                start_new_session=True, env=child_env, preexec_fn=torchrun.child_dies_with_parent,
            )
        watch = StallWatch(process, torchrun.watched_stall_timeout_s(spec), total_steps, stop_process_tree)
        memory = MemoryWatch(process, run_dir / "memory.csv", spec.host_memory_limit)
        with watch, memory:
            moments.reached("launched")
            stream(process, run_dir / "console.log", progress, task, watch.progressed)
    except signals.INTERRUPTS as caught:
        if process is None:
            raise  # nothing started: no summary, and the command removes what it claimed
        interrupt = caught
    with signals.held():
        if interrupt is not None:  # Phase 3
            stop_process_tree(process)
        # Phase 4
        interrupted_by = signals.signal_name(interrupt) if interrupt is not None else None
        summary = summarize(spec, run_dir, process.returncode, interrupted_by, time.monotonic() - started,
                            stalled=watch.message if watch is not None else None, memory=memory)
        summary.update(config=official_config or config, env=environment, command=torchrun.shell_quote(command))
        rundir.write_json(run_dir / rundir.SUMMARY, summary)
    if interrupt is not None:
        raise interrupt
    return summary


def number_or_none(value: object) -> float | None:
    return float(value) if is_number(value) else None


def summarize(spec: torchrun.LaunchSpec, run_dir: Path, exit_code: int, interrupted_by: str | None,
              duration_s: float, stalled: str | None = None, memory: MemoryWatch | None = None) -> dict:
    """The run's summary.json; interrupted_by: the signal that stopped it (SIGINT, SIGTERM, SIGHUP);
    stalled: the stall watch's message when it stopped the run; memory: the run's memory watch."""
    from zero_lab.analysis.tables import summarize_run  # pandas: once the run has ended

    rank_logs = rundir.collect_rank_logs(spec.log_dir, run_dir / "logs")
    parsed = parse_file(rundir.rank0_log(run_dir))
    rundir.write_metrics_csv(run_dir / "metrics.csv", parsed)
    failure = rundir.failure_from_console((run_dir / "console.log").read_text(errors="replace"))
    status = "interrupted" if interrupted_by else "stalled" if stalled else "ok" if exit_code == 0 else "failed"
    bad_input = bad_input_message(rank_logs, failure["rank_exit_code"]) if status == "failed" else None
    if bad_input:
        status = "bad_input"
    out_of_memory = out_of_memory_message(rank_logs, failure, memory) if status == "failed" else None
    params = parsed.model.get("params")
    world_size = parsed.zero.get("world_size") or parsed.rank.get("world_size") \
        or spec.multi_node.world_size(spec.nproc) or spec.nproc
    precision = PRECISION_OF_DTYPE_NAME.get(spec.workload.dtype, spec.workload.dtype)
    prediction = predict_run_peak(parsed.model, parsed.zero, spec.stage, precision, int(world_size))
    measured = summarize_run(parsed)
    predicted_peak_mb = prediction.peak / MB if prediction else None
    elsewhere = parsed.rank.get("global_rank") not in (None, 0, 0.0)
    return {
        "world_size": int(world_size),
        "note": (f"global rank 0 ran on another node: its [opt_step] lines and losses are in that node's run "
                 f"directory (this node ran global rank {int(parsed.rank['global_rank'])} and its local peers)")
        if elsewhere else None,
        "stage": spec.stage,
        "impl": spec.impl,
        "status": status,
        **measured,
        "predicted_peak_mb": predicted_peak_mb,
        "peak_error_pct": error_percent(predicted_peak_mb, measured["peak_alloc_max_mb"]),
        "exit_code": exit_code,
        **(failure if status in ("failed", "bad_input") else {"failed_rank": None, "rank_exit_code": None}),
        "interrupted_by": interrupted_by,
        "error": bad_input or stalled or out_of_memory,
        "failure": "out_of_memory" if out_of_memory else None,
        # the largest resident set of any local rank, sampled while the run lasted (memory.csv)
        "rss_max_mb": memory.record.rss_max_mb() if memory is not None else None,
        "log_tail": "" if status in ("ok", "interrupted") else rundir.log_tail(rank_logs or [run_dir / "console.log"]),
        "params": params if isinstance(params, int) and not isinstance(params, bool) else None,
        # the torch optimizer the impl stepped with (the harness's [model] line): FusedAdam, torch.optim.AdamW, ...
        "optimizer": parsed.model.get("optimizer"),
        "precision": precision,
        "offload": spec.workload.offload,
        # nano's model-state formula for this workload, per rank (the harness's [model] line)
        "states_formula_mb": number_or_none(parsed.model.get("states_formula_mb")),
        "states_formula_host_mb": number_or_none(parsed.model.get("states_formula_host_mb")),
        "duration_s": round(duration_s, 1),
        "run_dir": str(run_dir),
        "skipped_lines": parsed.skipped_lines,
        "warnings": parsed.warnings,
        "zero": parsed.zero,
        "model": parsed.model,
        "comm": parsed.comm,
        "phases": last_step_phases(parsed.phases),
        "losses": {str(step): loss for step, loss in parsed.losses().items()},
    }
