"""`zero-lab compare`: every (world size, stage, impl) cell, side by side, with a verdict.

    zero-lab compare --gpus 2 --device cpu --stages 1,2 --report reports/cpu-demo.md
    zero-lab compare --gpus 2,8 --stages 2 --dtype bfloat16 --warmup-steps 2 --fail-on-regression 5
    zero-lab compare --gpus 2 --device cpu --stages 1,2,3 --steps 6 --resume-check
    zero-lab compare --gpus 2 --device cpu --stages 2 --repeat 3
    zero-lab compare --script examples/hf_trainer.py --gpus 2 --device cpu --stages 2,3 -- --max-steps 8

Phase 1: check every input and prepare every run before the first launch; the preflight refuses
         cells predicted not to fit in memory (zero_lab.cli.preflight): one `note:` line each, with
         the cheapest change that fits, and a row "refused: would not fit" (status refused) beside
         the cells that ran; the command stops (exit 2) only when no cell fits. On CUDA a world size
         beyond the visible GPUs is not run: one `note:` line says so, and its cells are rows
         marked "needs N GPUs" (status not_run) beside the cells that ran.
Phase 2: per impl, an unrecorded warm-up (optional); then every cell, a failed one not stopping
         the others: with --repeat N, N times, the impls alternating (A B A B ...) so that a slow
         minute of a shared machine hits them all; with --resume-check, per cell a run that saves
         halfway and one that resumes.
         With --script each cell runs the user's script instead of the harness, given the cell's
         config as `--deepspeed_config PATH`; its engine prints the log contract (zero_lab.clients).
Phase 3: rows, deltas, step times and verdict (analysis.compare.comparison), printed as tables, JSON or
         markdown, saved as compare.json, and rendered as a report when asked; one line says when
         `zero-lab doctor` finds something in the comparison.
"""

from __future__ import annotations

import dataclasses

from pathlib import Path
from typing import Annotated, Optional

import typer

from zero_lab.analysis.runs import rundir
from zero_lab.analysis.report.trace_report import comm_summaries
from zero_lab.analysis.report.markdown import cell_tables, render_report, run_table, verdict_lines
from zero_lab.cli import input_checks, jobs, options, output, preflight
from zero_lab.cli import trace_options
from zero_lab.cli.environment import environment, say_where_auto_runs
from zero_lab.cli.errors import (BadInput, check_choice, check_not_negative, check_positive, one_line_errors,
                                 parse_int_list)
from zero_lab.cli.findings_cmd import hint
from zero_lab.cli.reporting import show_throughput, write_report
from zero_lab.cli.run_cmd import exit_code_of, report_problems

FORMATS = ("table", "json", "markdown")


@one_line_errors
@options.common_options
def compare(
    gpus: Annotated[str, typer.Option(help="World sizes, e.g. 2,8: GPUs per node on CUDA, processes on CPU.")] = "2",
    impls: Annotated[str, typer.Option(help="Impls, any of nano, official, fsdp2 (FSDP2: docs/fsdp2.md), and your own "
                                            "engines as NAME=PATH (docs/labs.md).")] = "nano,official",
    baseline: Annotated[Optional[str], typer.Option(help="The impl every delta is relative to (default official; "
                                                         "without official in --impls, the second impl).")] = None,
    stages: Annotated[str, typer.Option(help="ZeRO stages, e.g. 1,2.")] = "1,2",
    warmup_steps: Annotated[int, typer.Option(help="Unrecorded warm-up run per impl first (0: none).")] = 0,
    repeat: Annotated[int, typer.Option(help="Run each cell N times, alternating the impls (A B A B ...); each "
                                             "impl's step times are pooled over its N runs.", metavar="N")] = 1,
    report: Annotated[Optional[Path], typer.Option(help="Also write a markdown report (and PNG plots) here.")] = None,
    loss_tol: Annotated[Optional[float], typer.Option(help="Max per-step loss difference for parity (default 1e-4 fp32, 5e-2 bf16/fp16).")] = None,
    fail_on_regression: Annotated[Optional[float], typer.Option(help="Exit 1 when a memory figure of an impl exceeds the baseline's by more than PCT %, or its step time does beyond noise (verdict slower).", metavar="PCT")] = None,
    format: Annotated[str, typer.Option(help="table, json (one object; docs/compare-json.md) or markdown.")] = "table",
    resume_check: Annotated[bool, typer.Option(help="Also prove exact resume per cell: train half the steps, save, "
                                                    "resume to the end; the losses after the checkpoint must equal "
                                                    "the uninterrupted run's (a gate).")] = False,
    script: Annotated[Optional[Path], typer.Option(help="Your own DeepSpeed training script instead of the built-in "
                                                         "workload: run under torchrun with `--deepspeed_config PATH` "
                                                         "appended; the arguments after `--` are the script's.")] = None,
    save_every: Annotated[int, typer.Option(help="With --max-restarts: each cell saves a checkpoint every K steps "
                                                 "(in its directory), where a restart resumes.", metavar="K")] = 0,
    trace: trace_options.Trace = False,
    trace_steps: trace_options.TraceSteps = None,
    *,
    common: options.Common,
) -> None:
    """Run nano and official DeepSpeed (and FSDP2) on the same workload and compare memory, loss and speed.

    Exit codes: 0 fine, 1 a gate failed (loss parity, --fail-on-regression), 2 bad input, 3 a run
    failed, 130 Ctrl-C, 143 SIGTERM, 129 SIGHUP. Arguments after `--` go to torchrun, or with
    --script to the script.
    """
    # Phase 1
    check_choice(format, "--format", FORMATS)
    check_not_negative(warmup_steps, "--warmup-steps")
    check_positive(repeat, "--repeat")
    check_not_negative(loss_tol, "--loss-tol")
    check_not_negative(fail_on_regression, "--fail-on-regression")
    world_sizes = parse_int_list(gpus, "--gpus")
    stage_list = [input_checks.check_stage(stage, "--stages") for stage in parse_int_list(stages, "--stages")]
    impl_list = [impl.strip() for impl in impls.split(",") if impl.strip()]
    impl_list, own_engines = input_checks.own_impls(impl_list)  # NAME=PATH: an own engine, named NAME
    if baseline is not None and baseline not in impl_list:
        raise BadInput(f"--baseline {baseline} is not one of --impls {','.join(impl_list)}",
                       "pass one of the impls compared")
    baseline_impl = baseline or "official"
    shared = common.shared
    shared.workload = cells_save_every(shared, save_every)
    shared.own_engines = own_engines
    if script is not None:  # the arguments after `--` are the script's, not torchrun's
        if warmup_steps or resume_check:
            raise BadInput("--warmup-steps and --resume-check need the built-in workload, not --script",
                           "drop them, or compare without --script")
        shared.script = input_checks.user_script(script, shared.extra_torchrun_args, common.given)
        shared.extra_torchrun_args = []
    world_sizes, lacking_gpus = jobs.split_by_visible_gpus(shared, world_sizes)
    for size, reason in lacking_gpus.items():
        output.stderr.print(f"note: --gpus {size} {reason}: its cells are not run, and marked so", markup=False,
                            highlight=False)
    shared.workload = trace_options.with_trace(shared.workload, trace, trace_steps, script=script is not None)
    jobs.check(shared, impl_list, world_sizes)
    impl_list = jobs.impls_that_can_run(shared, impl_list)
    with input_checks.claimed_directory(common.out, common.name, f"compare-{rundir.timestamp()}") as compare_dir:
        warmups = trace_options.untraced([
            jobs.prepare(shared, impl, stage_list[0], world_sizes[0],
                         compare_dir / "warmup" / rundir.cell_name(impl, stage_list[0], world_sizes[0]), steps=warmup_steps)
            for impl in impl_list if warmup_steps
        ])
        cells = [
            jobs.prepare(shared, impl, stage, world_size,
                         compare_dir / "cells" / repeat_name(rundir.cell_name(impl, stage, world_size), run),
                         note=f"run {run} of {repeat}" if repeat > 1 else None)
            for world_size in world_sizes for stage in stage_list for run in range(1, repeat + 1) for impl in impl_list
        ]
        resumes = [job for world_size in world_sizes for stage in stage_list for impl in impl_list if resume_check
                   for job in jobs.resume_pair(shared, impl, stage, world_size, compare_dir / "resume"
                                               / rundir.cell_name(impl, stage, world_size))]
        jobs.warn_passed_to_official(warmups + cells + resumes)
        cells, refused = preflight.admit(cells, shared.device, shared.device_memory_gb, common.force)
        going = {(job.spec.impl, job.spec.stage, job.spec.nproc) for job in cells}
        warmups, resumes = ([job for job in group if (job.spec.impl, job.spec.stage, job.spec.nproc) in going]
                            for group in (warmups, resumes))
        say_where_auto_runs(common.requested_device, shared.device)
        if restarts_note := jobs.restart_from_the_start_note(shared, "add --save-every K"):
            output.stderr.print(restarts_note, markup=False, highlight=False)
        # Phase 2
        env = environment(shared.device)
        _, interrupted_by = jobs.run_jobs(warmups, env) if warmups else ([], None)
        summaries, interrupted_by = ([], interrupted_by) if interrupted_by else jobs.run_jobs(cells, env)
        resumed, interrupted_by = ([], interrupted_by) if interrupted_by or not resumes else jobs.run_jobs(resumes, env)
        if interrupted_by and not rundir.holds_a_run(compare_dir):  # stopped before the first launch
            raise typer.Exit(exit_code_of(summaries, interrupted_by))
        summaries += refused + jobs.not_run(shared, lacking_gpus, stage_list, impl_list)
    # Phase 3
    from zero_lab.analysis.compare.comparison import build_comparison  # pandas: once the runs have ended

    comparison = build_comparison(summaries, impl_list, loss_tol, fail_on_regression, interrupted_by,
                                  resumed=[run for run in resumed if run["run_dir"].endswith("resumed")]
                                  if resume_check else None, baseline=baseline_impl)
    comparison.update(interrupted=interrupted_by is not None, compare_dir=str(compare_dir), environment=env)
    comparison["divergences"] = find_divergences(summaries, impl_list, baseline_impl, comparison["verdict"]["loss_tol"])
    traced = comm_summaries(summaries) if shared.workload.trace_steps else []
    if traced:  # --trace: each impl's communication in DeepSpeed's comms-logger shape
        comparison["comm_summary"] = traced
    if shared.script is not None:
        comparison["script"] = {"path": str(script), "arguments": shared.script.arguments}
    rundir.write_json(compare_dir / rundir.COMPARE, output.json_safe(comparison))
    if report is not None:
        title = (f"zero-lab: nano vs official DeepSpeed on {script}" if script is not None
                 else f"zero-lab: {', '.join(impl_list)}" if len(impl_list) > 2 else None)
        write_report(comparison, summaries, report, *([title] if title else []))
    show(comparison, summaries, format)
    show_divergences(comparison, format)
    report_problems(summaries)
    hint(compare_dir)
    raise typer.Exit(exit_code_of(summaries, interrupted_by) or comparison["verdict"]["exit_code"])


def cells_save_every(shared: jobs.SharedSettings, save_every: int):
    """The workload with compare's --save-every K, which only a restart reads (each cell's checkpoints
    go to its own directory: `jobs.with_restarts`)."""
    check_not_negative(save_every, "--save-every")
    if save_every and not shared.max_restarts:
        raise BadInput("--save-every on compare keeps checkpoints for restarts only", "add --max-restarts N")
    return dataclasses.replace(shared.workload, save_every=save_every)


def find_divergences(summaries: list[dict], impl_list: list[str], baseline_impl: str, tolerance: float) -> list[dict]:
    """Each run whose losses part from the baseline's: the step, the gradients, the collectives (analysis.compare.divergence)."""
    from zero_lab.analysis.compare.divergence import divergences

    baseline = baseline_impl if baseline_impl in impl_list else impl_list[min(1, len(impl_list) - 1)]
    return divergences(summaries, baseline, tolerance)


def show_divergences(comparison: dict, format: str) -> None:
    """Under the verdict, where each run that parts from the baseline parts first (JSON: `divergences`)."""
    from zero_lab.analysis.compare.divergence import divergence_lines

    if format == "json":
        return
    for record in comparison["divergences"]:
        for line in divergence_lines(record):
            output.stdout.print(line, markup=False, highlight=False)


def repeat_name(cell: str, run: int) -> str:
    """A cell's run directory: the cell's name, `-run<k>` after it from the second run of --repeat on."""
    return cell if run == 1 else f"{cell}-run{run}"


def show(comparison: dict, summaries: list[dict], format: str) -> None:
    if format == "json":
        output.print_json(comparison)
        return
    if format == "markdown":
        print(render_report(comparison, summaries, "zero-lab compare", plots=[]))
        return
    for title, headers, body in cell_tables(comparison["rows"], comparison["deltas"], comparison["step_times"]):
        output.print_table(headers, body, title=title)
    output.print_table(*run_table(comparison["rows"]), title="runs")
    show_throughput(comparison["rows"])
    for line in verdict_lines(comparison["verdict"]):
        output.stdout.print(line.replace("**", ""), markup=False, highlight=False)
