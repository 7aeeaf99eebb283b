"""Run one torchrun job into a run directory, with live progress and a clean stop.

Phase 1: write what the run is given (command, configs, environment) before it starts; each
         rank keeps its flight record of collectives in the run's logs/ (`collective_record`).
Phase 2: pick a free port, then at once start torchrun in its own session (a port picked earlier
         could have been taken by a concurrent comparison), with stop signals deferred until its
         process is known (zero_lab.signals.deferred). Stream rank 0's output: to
         console.log, and each `[opt_step k]` line to the progress bar with its loss, and to the stall watch
         (zero_lab.launch.stall), which stops the run when no step comes for --stall-timeout seconds.
         The memory watch (zero_lab.launch.memory_watch) samples every rank's resident memory.
Phase 3: on Ctrl-C, SIGTERM or SIGHUP (zero_lab.signals), stop torchrun's process group and
         every worker's (torchrun starts each worker in a session of its own), SIGTERM then
         SIGKILL, within seconds. However the run ended, stop the ranks its torchrun agent left
         running (an agent killed or lost leaves its ranks, out of reach of its process group:
         the memory watch knows them).
Phase 4: gather every rank's log, and have `analysis.runs.rundir` parse rank 0's and write
         metrics.csv and summary.json - also for a failed or interrupted run, so its partial
         results stay; a rank that ran out of memory is named with the figures
         (`failure: out_of_memory`), from the harness's own line or the memory watch's verdict.
Phases 3 and 4 run with those signals held off, so a second one cannot cut them short.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import psutil
from rich.progress import Progress

from zero_lab import signals
from zero_lab.analysis.runs import rundir
from zero_lab.analysis.runs.logparse import step_and_loss
from zero_lab.launch import moments, torchrun
from zero_lab.launch.engine_switch import impl_environment
from zero_lab.workload.tracing.trace_settings import trace_environment
from zero_lab.launch.memory_watch import MemoryWatch
from zero_lab.launch.stall import StallWatch
from zero_lab.workload.meters.collective_record import RECORD_DIRECTORY_ENVIRONMENT
from zero_lab.workload.meters.parameter_norms import PARAMETER_NORMS_ENVIRONMENT, PARAMETER_NORMS_FILE

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


def stop_leftovers(workers: list[psutil.Process]) -> None:
    """SIGKILL ranks that outlived their torchrun agent (it was killed, or died): nothing else ends them."""
    for worker in workers:
        try:
            worker.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(workers, timeout=STOP_GRACE_S)


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
    child_env[RECORD_DIRECTORY_ENVIRONMENT] = str(run_dir.resolve() / "logs")  # each rank's flight record
    if spec.script is None:  # the harness's rank 0 writes each parameter's norm after every step
        child_env[PARAMETER_NORMS_ENVIRONMENT] = str(run_dir.resolve() / "logs" / PARAMETER_NORMS_FILE)
    child_env.update(torchrun.agent_store_environment(spec))
    child_env.update(trace_environment(run_dir, spec.workload.trace_steps))  # --trace: each rank's timeline
    if spec.workload.check_collectives:  # torch's own check of each collective across ranks (docs/doctor.md)
        child_env["TORCH_DISTRIBUTED_DEBUG"] = "DETAIL"
    total_steps = spec.workload.steps if spec.script is None else None  # a script decides its own
    task = progress.add_task(label, total=total_steps, loss="-") if progress is not None else None
    # Phase 2
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
        if memory is not None:  # ranks a dead agent left behind
            stop_leftovers(memory.leftover_workers())
        # Phase 4
        interrupted_by = signals.signal_name(interrupt) if interrupt is not None else None
        summary = summarize(spec, run_dir, process.returncode, interrupted_by, time.monotonic() - started,
                            stalled=watch.message if watch is not None else None, memory=memory)
        summary.update(config=official_config or config, env=environment, command=torchrun.shell_quote(command))
        rundir.write_summary(run_dir, summary)
    if interrupt is not None:
        raise interrupt
    return summary


def summarize(spec: torchrun.LaunchSpec, run_dir: Path, exit_code: int, interrupted_by: str | None,
              duration_s: float, stalled: str | None = None, memory: MemoryWatch | None = None) -> dict:
    """The run's summary (`rundir.summarize`, which owns its format) from what this launch knows:
    the spec, how the run ended (interrupted_by: the signal that stopped it; stalled: the stall
    watch's message) and the memory watch (its verdict on a killed rank, the largest resident set)."""
    rank_logs = rundir.collect_rank_logs(spec.log_dir, run_dir / "logs")
    return rundir.summarize(
        run_dir, rank_logs, impl=spec.impl, stage=spec.stage, dtype=spec.workload.dtype, offload=spec.workload.offload,
        launched_world_size=spec.multi_node.world_size(spec.nproc) or spec.nproc, exit_code=exit_code,
        interrupted_by=interrupted_by, duration_s=duration_s, stalled=stalled,
        killed_for_memory=memory.out_of_memory if memory is not None else None,
        rss_max_mb=memory.record.rss_max_mb() if memory is not None else None,
        peak_tflops=spec.workload.peak_tflops)
