"""`zero-lab timeline`: one traced step of each run, read from its `--trace` timeline: when each
collective was issued (the forward, autograd, after autograd, the optimizer step) and its wire bytes
(`analysis.runs.speed.overlap`): what could overlap computation, and what could not.

    zero-lab compare --gpus 2 --device cpu --stages 0,2,3 --steps 3 --trace-steps 3 --name traced
    zero-lab timeline runs/traced
    zero-lab timeline runs/traced --format json --plot overlap.png

Phase 1: every run under the paths (a compare directory's cells, or runs) that wrote a timeline;
         bad input when none did. The step is --step, else each run's last traced step; the rank
         is --rank (0).
Phase 2: per run, the step's collectives by moment.
Phase 3: a table per figure, or JSON; with --plot, the wire bytes by moment as a picture.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from zero_lab.cli import output
from zero_lab.cli.errors import BadInput, check_choice, one_line_errors

FORMATS = ("table", "json")
ORDER_NOTE = ("what a call issued in the forward or autograd really overlaps depends on when the engine waits "
              "for it: open trace/trace-rank<N>.json in Perfetto to see the spans (on a CPU their times say in "
              "what order things ran, not how fast a GPU would run them)")


def traced_runs(paths: list[Path], step: int | None, rank: int) -> list[dict]:
    """Phases 1 and 2: each traced run as `--format json` prints it."""
    from zero_lab.analysis.runs import rundir
    from zero_lab.analysis.runs.speed.overlap import issued, moments
    from zero_lab.analysis.runs.traces import read_traces

    for path in paths:
        if not path.is_dir():
            raise BadInput(f"{path} is not a directory", "pass what `zero-lab run` or `zero-lab compare` wrote")
    runs = []
    for summary_path in rundir.find_summaries(paths):
        traces = read_traces(summary_path.parent)
        if not traces:
            continue
        if rank >= len(traces):
            raise BadInput(f"--rank {rank}: {summary_path.parent} holds the timelines of {len(traces)} ranks",
                           f"pass --rank 0 to {len(traces) - 1}")
        trace, summary = traces[rank], rundir.read_json(summary_path)
        recorded = trace.get("recordedSteps") or []
        chosen = recorded[-1] if step is None and recorded else step
        if chosen not in recorded:
            raise BadInput(f"--step {step}: {summary_path.parent} traced step(s) {', '.join(map(str, recorded)) or 'none'}",
                           "pass one of them (or leave --step out for the last)")
        runs.append({"run": f"{summary.get('impl')} s{summary.get('stage')} W={summary.get('world_size')}",
                     "directory": str(summary_path.parent), "step": chosen, "rank": rank,
                     "moments": moments(issued(trace, chosen))})
    if not runs:
        raise BadInput(f"no run under {', '.join(map(str, paths))} wrote a timeline",
                       "run it with --trace (or --trace-steps N), then pass its directory")
    return runs


def print_runs(runs: list[dict]) -> None:
    """Phase 3, as tables."""
    body = []
    for run in runs:
        for moment, row in run["moments"].items():
            if row["calls"]:
                body.append([run["run"], moment, str(row["calls"]), ", ".join(row["ops"]),
                             f"{row['wire_bytes'] / 2**20:.2f}"])
    output.print_table(["run", "issued in", "calls", "ops", "wire MB"], body,
                       title=f"collectives of step {runs[0]['step']} by when they were issued (rank {runs[0]['rank']})")
    output.stdout.print(f"note: {ORDER_NOTE}", markup=False, highlight=False)


@one_line_errors
def timeline(
    paths: Annotated[list[Path], typer.Argument(help="Run or compare directories written with --trace.",
                                                show_default=False)],
    step: Annotated[Optional[int], typer.Option(help="The traced step to read (default: each run's last).")] = None,
    rank: Annotated[int, typer.Option(help="Whose timeline to read.")] = 0,
    format: Annotated[str, typer.Option(help="table or json.")] = "table",
    plot: Annotated[Optional[Path], typer.Option(help="Also draw each run's wire bytes by when they were issued, "
                                                      "in a PNG.", metavar="FILE")] = None,
) -> None:
    """One traced step of each run: when each collective was issued (forward, autograd, after
    autograd, optimizer step) and its wire bytes: what could overlap computation."""
    check_choice(format, "--format", FORMATS)
    runs = traced_runs(paths, step, rank)
    if plot is not None:
        from zero_lab.analysis.report.overlap_plot import plot_overlap

        plot.parent.mkdir(parents=True, exist_ok=True)
        plot_overlap(f"one step, rank {rank}: wire MB by when it was issued", runs, plot)
    if format == "json":
        output.print_json({"runs": runs, "note": ORDER_NOTE})
    else:
        print_runs(runs)
