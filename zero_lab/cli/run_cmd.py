"""`zero-lab run`: one training run of one impl, saved as a run directory.

    zero-lab run --impl nano --gpus 2 --device cpu --model tiny --steps 10
    zero-lab run --impl official --gpus 8 --stage 2 --dtype bfloat16 -- --max-restarts 0
    zero-lab run --impl nano --gpus 2 --device cpu --steps 4 --save-dir runs/ckpt --save-every 2
    zero-lab run --impl nano --gpus 2 --device cpu --steps 8 --save-dir runs/ckpt --resume
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Annotated

import typer

from zero_lab import signals
from zero_lab.analysis.runs import rundir
from zero_lab.analysis.report.markdown import run_table
from zero_lab.cli import input_checks, jobs, options, output, preflight
from zero_lab.cli import trace_options
from zero_lab.cli.environment import environment, say_where_auto_runs
from zero_lab.cli.findings_cmd import hint
from zero_lab.cli.reporting import show_throughput
from zero_lab.cli.errors import (EXIT_BAD_INPUT, EXIT_RUN_FAILED, BadInput, check_choice, check_not_negative,
                                 one_line_errors)

EXTRA_ARGS = {"allow_extra_args": True}
FORMATS = ("table", "json")


def stage_of(config: dict) -> int:
    return int(config.get("zero_optimization", {}).get("stage", 0))


def exit_code_of(summaries: list[dict], interrupted_by: str | None) -> int | None:
    """Exit code decided by the runs alone (None: they all finished; the caller's gates decide)."""
    if interrupted_by:
        return signals.interrupted_exit_code(interrupted_by)
    statuses = {summary["status"] for summary in summaries}
    if "bad_input" in statuses:
        return EXIT_BAD_INPUT
    if statuses - {"ok", *rundir.NEVER_STARTED}:  # a cell that never started (too few GPUs, refused) failed nothing
        return EXIT_RUN_FAILED
    return None


def report_problems(summaries: list[dict]) -> None:
    """One line per run that did not finish, on stderr: the harness's error or the log tail (a
    cell that never started was said before anything ran)."""
    for summary in summaries:
        where = f"world_size={summary['world_size']} stage={summary['stage']} impl={summary['impl']}"
        if summary["status"] in rundir.NEVER_STARTED:
            continue
        if summary["status"] == "bad_input":
            output.stderr.print(f"error: {summary['error']}", markup=False, highlight=False)
        elif summary["status"] == "interrupted":
            output.stderr.print(f"{where}: interrupted by {summary.get('interrupted_by') or 'SIGINT'}; logs in "
                                f"{summary['run_dir']}", markup=False, highlight=False)
        elif summary["status"] == "stalled" or summary.get("failure") == "out_of_memory":
            output.stderr.print(f"{where}: {summary['error']}; logs in {summary['run_dir']}", markup=False,
                                highlight=False)
        elif summary["status"] != "ok":
            code = summary.get("rank_exit_code") or summary.get("exit_code")
            ended = rundir.who_exited(summary.get("failed_rank"), code) if code is not None else "no exit code"
            output.stderr.print(f"{where}: {summary['status']} ({ended}); logs in {summary['run_dir']}",
                                markup=False, highlight=False)
            if summary.get("log_tail"):
                output.stderr.print(summary["log_tail"], markup=False, highlight=False)


def check_restart_save_dir(shared: jobs.SharedSettings) -> None:
    """A restart resumes from the `latest` of --save-dir: one left there by an earlier run would be
    resumed instead of this run's own start, so a fresh run that may restart needs a fresh directory."""
    work = shared.workload
    if shared.max_restarts and work.save_dir and work.resume is None and (Path(work.save_dir) / "latest").is_file():
        raise BadInput(f"--save-dir {work.save_dir} already holds a checkpoint (`latest`), which a restart would "
                       "resume from instead of this run's own", "give an empty --save-dir, or add --resume")


@one_line_errors
@options.common_options
def run(
    impl: Annotated[str, typer.Option(help="nano, official, fsdp2 (FSDP2: docs/fsdp2.md), or your own engine as "
                                           "NAME=PATH (docs/labs.md).")] = "nano",
    gpus: Annotated[int, typer.Option(help="Processes per node: GPUs on CUDA, processes on CPU.")] = 1,
    stage: Annotated[int | None, typer.Option(help="ZeRO stage; overrides the config's.")] = None,
    format: Annotated[str, typer.Option(help="table or json.")] = "table",
    save_dir: Annotated[Path | None, typer.Option(help="Save checkpoints here (DeepSpeed's files; DCP with fsdp2): "
                                                       "after the last step, and every --save-every steps.")] = None,
    save_every: Annotated[int, typer.Option(help="Also save every K optimizer steps (needs --save-dir).")] = 0,
    resume: Annotated[bool, typer.Option(help="Load the checkpoint in --save-dir first and continue from its "
                                              "step up to --steps.")] = False,
    resume_tag: Annotated[str | None, typer.Option(help="With --resume: the tag to load (default: the one "
                                                        "`latest` names).")] = None,
    trace: trace_options.Trace = False,
    trace_steps: trace_options.TraceSteps = None,
    *,
    common: options.Common,
) -> None:
    """Train one impl under torchrun and save runs/<run-id>/ (logs, metrics.csv, summary.json).

    Arguments after `--` go to torchrun.
    """
    check_choice(format, "--format", FORMATS)
    shared = common.shared
    (impl,), shared.own_engines = input_checks.own_impls([impl])  # NAME=PATH: an own engine, named NAME
    if (resume or save_every or resume_tag) and save_dir is None:
        raise BadInput("--resume, --resume-tag and --save-every need --save-dir", "add --save-dir DIR")
    check_not_negative(save_every, "--save-every")
    if resume and not (save_dir / "latest").is_file() and resume_tag is None:
        raise BadInput(f"--resume found no checkpoint in {save_dir} (no `latest` file)",
                       "save one first with --save-dir, or pass --resume-tag")
    shared.workload = dataclasses.replace(
        shared.workload, save_dir=str(save_dir.resolve()) if save_dir else None, save_every=save_every,
        resume=(resume_tag or "latest") if resume or resume_tag else None)
    check_restart_save_dir(shared)
    shared.workload = trace_options.with_trace(shared.workload, trace, trace_steps, script=False)
    jobs.check(shared, [impl], [gpus])
    config = shared.config_path
    if stage is None:
        stage = input_checks.check_stage(stage_of(input_checks.load_config_file(config)), f"zero_optimization.stage of {config}") if config else 2
    input_checks.check_stage(stage, "--stage")
    default_name = f"{rundir.timestamp()}-{rundir.cell_name(impl, stage, gpus)}"
    with input_checks.claimed_directory(common.out, common.name, default_name) as run_dir:
        job = jobs.prepare(shared, impl, stage, gpus, run_dir)
        jobs.warn_passed_to_official([job])
        preflight.check([job], shared.device, shared.device_memory_gb, common.force)
        say_where_auto_runs(common.requested_device, shared.device)
        if restarts_note := jobs.restart_from_the_start_note(shared, "add --save-dir DIR --save-every K"):
            output.stderr.print(restarts_note, markup=False, highlight=False)
        summaries, interrupted_by = jobs.run_jobs([job], environment(shared.device))
        if not summaries:  # interrupted before torchrun started: the directory goes again
            raise typer.Exit(exit_code_of(summaries, interrupted_by))
    summary = summaries[0]
    if summary["status"] == "bad_input":
        pass  # the harness's one line below says it all
    elif format == "json":
        output.print_json({key: value for key, value in summary.items() if key != "losses"})
    else:
        output.print_table(*run_table(summaries), title=f"{run_dir}")
        show_throughput(summaries)
    if summary.get("note"):
        output.stderr.print(f"note: {summary['note']}", markup=False, highlight=False)
    report_problems(summaries)
    hint(run_dir)
    raise typer.Exit(exit_code_of(summaries, interrupted_by) or 0)
