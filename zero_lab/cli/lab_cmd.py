"""`zero-lab lab list|start|check`: write each ZeRO stage yourself, checked byte by byte (docs/labs.md).

    zero-lab lab list
    zero-lab lab start zero1 lab_zero1
    zero-lab lab check zero1 lab_zero1

Phase 1 (check): the lab's package runs as an impl (`yours`, `--impl yours=DIR`) on the tiny model
         at each world size (2 and 3 by default), and so does nano, whose runs are kept in
         DIR/.zero-lab/ and reused while the step count is the same.
Phase 2: per world size, the four checks of zero_lab.labs.check in order; the first that fails
         stops the check (exit 1) with its figures and a hint.
Phase 3: when all pass, official DeepSpeed runs too (kept like nano's), and one table puts the
         learner's figures beside nano's and official's.
"""

from __future__ import annotations

import functools

import json
import shutil
from pathlib import Path
from typing import Annotated, Optional

import typer

from zero_lab.cli import jobs, output
from zero_lab.cli.errors import BadInput, check_positive, one_line_errors, parse_int_list
from zero_lab.labs.catalog import LABS, Lab, lab_named

lab_app = typer.Typer(help="Labs: write ZeRO stage by stage in an engine of your own, checked byte by byte against "
                           "nano and official DeepSpeed (docs/labs.md).", no_args_is_help=True)
LEARNER = "yours"  # the impl name of the learner's engine in every run and table
RUNS = ".zero-lab"  # where check keeps its runs, inside the lab directory

Name = Annotated[str, typer.Argument(help="The lab: zero1, zero2, ... (zero-lab lab list).")]
Directory = Annotated[Optional[Path], typer.Argument(help="The lab's directory (default: lab_<NAME>).")]


def lab_or_bad_input(name: str) -> Lab:
    lab = lab_named(name)
    if lab is None:
        raise BadInput(f"no lab named {name!r}", f"choose from {', '.join(lab.name for lab in LABS)} (zero-lab lab list)")
    return lab


@lab_app.command("list")
@one_line_errors
def list_labs() -> None:
    """The labs, in course order, with the stage each engine runs and the functions to write."""
    output.print_table(["lab", "stage", "what you write", "lesson"],
                       [[lab.name, str(lab.stage), ", ".join(lab.functions), lab.lesson] for lab in LABS],
                       title="labs", numeric=False)
    for lab in LABS:
        output.stdout.print(f"{lab.name}: {lab.title}", markup=False, highlight=False)


@lab_app.command()
@one_line_errors
def start(name: Name, directory: Directory = None) -> None:
    """Write the lab's engine package (it runs stage 0; lab.py holds the functions to write) and its README."""
    from zero_lab.labs.start import start as write_lab

    lab = lab_or_bad_input(name)
    directory = directory or Path(f"lab_{lab.name}")
    if (directory / "lab.py").exists():
        raise BadInput(f"{directory} already holds a lab (its lab.py would be overwritten)",
                       "check it with zero-lab lab check, or start in another directory")
    for path in write_lab(lab, directory):
        output.stdout.print(f"wrote {path}", markup=False, highlight=False)
    output.stdout.print(f"next: write the functions of {directory / 'lab.py'}, then zero-lab lab check {lab.name} "
                        f"{directory}", markup=False, highlight=False)


def lab_config(lab: Lab, runs: Path) -> Path | None:
    """The lab's config, written into `runs` (None: the harness's zero<stage>.json as it is)."""
    if not lab.config:
        return None
    from zero_lab.cli import input_checks

    config = input_checks.load_config_file(input_checks.default_config_path(lab.stage))
    for section, values in lab.config.items():
        config[section] = {**config.get(section, {}), **values}
    runs.mkdir(parents=True, exist_ok=True)
    path = runs / "config.json"
    path.write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    return path


def shared_settings(lab: Lab, directory: Path, steps: int) -> jobs.SharedSettings:
    from zero_lab.launch import torchrun

    workload = torchrun.Workload(model="tiny", steps=steps, dtype=lab.dtype, seq_len=lab.seq_len)
    return jobs.SharedSettings(config_path=lab_config(lab, directory / RUNS), device="cpu", workload=workload,
                               multi_node=torchrun.MultiNode(), extra_torchrun_args=[], stall_timeout_s=600.0,
                               own_engines={LEARNER: directory})


def run_cell(shared: jobs.SharedSettings, impl: str, lab: Lab, world_size: int, run_dir: Path, keep: bool) -> dict:
    """One run's summary: a kept one when `keep` and it finished with these steps, else a new run."""
    from zero_lab.analysis.runs import rundir
    from zero_lab.cli.environment import environment

    summary_path = run_dir / rundir.SUMMARY
    if keep and summary_path.is_file():
        kept = rundir.read_json(summary_path)
        # kept when it finished these steps and says what each update was (a summary before `updates`: run again)
        if kept.get("status") == "ok" and kept.get("steps") == shared.workload.steps and "updates" in kept:
            return kept
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    summaries, interrupted_by = jobs.run_jobs([jobs.prepare(shared, impl, lab.stage, world_size, run_dir)],
                                              environment("cpu"))
    if interrupted_by:
        from zero_lab import signals

        raise typer.Exit(signals.interrupted_exit_code(interrupted_by))
    return summaries[0]


def say(result) -> None:
    from zero_lab.labs.check import printed

    for line in printed(result):
        output.stdout.print(line, markup=False, highlight=False)


@lab_app.command()
@one_line_errors
def check(
    name: Name,
    directory: Directory = None,
    gpus: Annotated[str, typer.Option(help="World sizes (processes on CPU).")] = "2,3",
    steps: Annotated[Optional[int], typer.Option(help="Optimizer steps of each run (default 6: the losses then "
                                                       "show 3 updates, the harness's first two run at learning "
                                                       "rate 0).")] = None,
    official: Annotated[bool, typer.Option(help="Once every check passes, run official DeepSpeed too and show its "
                                                "figures beside yours and nano's.")] = True,
) -> None:
    """Run your lab engine beside nano on the tiny model and check it: runs, losses, bytes, wire bytes.

    Exit codes: 0 every check passed, 1 a check failed, 2 bad input.
    """
    from zero_lab.analysis.compare.metrics import resolve_loss_tol
    from zero_lab.labs import check as checks

    # Phase 1
    lab = lab_or_bad_input(name)
    directory = directory or Path(f"lab_{lab.name}")
    if not (directory / "lab.py").is_file() or not (directory / "__init__.py").is_file():
        raise BadInput(f"{directory} holds no lab package (no lab.py and __init__.py)",
                       f"write one with: zero-lab lab start {lab.name} {directory}")
    steps = lab.steps if steps is None else steps
    check_positive(steps, "--steps")
    world_sizes = parse_int_list(gpus, "--gpus")
    shared = shared_settings(lab, directory.resolve(), steps)
    if official and lab.dtype == "float16":
        output.stderr.print("note: official DeepSpeed rejects fp16 on CPU; your figures are shown beside nano's",
                            markup=False, highlight=False)
        official = False
    jobs.check(shared, [LEARNER, "nano"], world_sizes)
    runs = directory / RUNS
    tolerance = resolve_loss_tol(None, ["fp32"])
    figures = []
    # Phase 2
    for world_size in world_sizes:
        mine = run_cell(shared, LEARNER, lab, world_size, runs / f"w{world_size}-{LEARNER}", keep=False)
        # nano's run, made (or kept) only once the learner's has run
        nano = functools.partial(run_cell, shared, "nano", lab, world_size, runs / f"w{world_size}-nano", keep=True)
        results = checks.checks_in_order(mine, lab, nano, tolerance)
        for result in results:
            say(result)
        if not results[-1].ok:
            output.stdout.print(f"lab {lab.name}: not yet - {results[-1].check} fails at world size {world_size}",
                                markup=False, highlight=False)
            raise typer.Exit(1)
        figures.append((world_size, mine, nano()))  # kept: read back, not run again
    # Phase 3
    rows = []
    for world_size, mine, nano in figures:
        cells = [(LEARNER, mine), ("nano", nano)]
        if official:
            cells.append(("official", run_cell(shared, "official", lab, world_size,
                                               runs / f"w{world_size}-official", keep=True)))
        rows += [figure_row(world_size, impl, run) for impl, run in cells]
    output.print_table(["world size", "impl", "last loss", "alloc after step B", "wire B / step"], rows,
                       title=f"lab {lab.name}: yours beside nano{' and official' if official else ''}")
    output.stdout.print(f"lab {lab.name}: every check passed", markup=False, highlight=False)


def figure_row(world_size: int, impl: str, run: dict) -> list[str]:
    """One row of the closing table: the last loss, the bytes held after the last step, the wire bytes per step."""
    from zero_lab.labs.check import phase_rows

    if run.get("status") != "ok":
        return [str(world_size), impl, run.get("status", "?"), "", ""]
    wire = sum(int(line["wire_bytes_per_step"]) for line in run.get("comm") or [])
    after_step = int(phase_rows(run).get("after_step", {}).get("live_bytes", 0))
    return [str(world_size), impl, f"{run['loss_last']:.6f}", f"{after_step:,}", f"{wire:,}"]
