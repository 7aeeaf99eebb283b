"""`--trace` and `--trace-steps`, shared by `run` and `compare`: checked once, before any launch.

The launcher hands the chosen steps to every rank (`workload.tracing.trace_settings`); each rank writes its
timeline and memory snapshot into `<run dir>/trace/` (docs/trace.md).
"""

from __future__ import annotations

import dataclasses
from typing import Annotated, Optional

import typer

from zero_lab.cli.errors import BadInput
from zero_lab.workload.tracing.trace_settings import DEFAULT_TRACE_STEPS, STEPS_FIX, parse_steps

TRACE = "Trace (docs/trace.md)"

Trace = Annotated[bool, typer.Option(
    help="Each rank writes trace/trace-rank<N>.json (Chrome trace events: Perfetto, chrome://tracing, HTA) and "
         "trace/memory-snapshot-rank<N>.pickle (torch's memory viewer) for the traced steps.",
    rich_help_panel=TRACE)]
TraceSteps = Annotated[Optional[str], typer.Option(
    help=f"The optimizer steps traced, e.g. 2-3 or 1,4 (default {DEFAULT_TRACE_STEPS}: the first steps); "
         "implies --trace.", metavar="STEPS", rich_help_panel=TRACE)]


def traced_steps(trace: bool, trace_steps: str | None, steps: int | None) -> str | None:
    """The steps to trace as the ranks read them (None: no trace); BadInput for steps that do not
    parse, or none of which the run reaches (steps None: a script decides how many it runs)."""
    if not trace and trace_steps is None:
        return None
    text = trace_steps or DEFAULT_TRACE_STEPS
    try:
        chosen = parse_steps(text)
    except ValueError as error:
        raise BadInput(str(error), STEPS_FIX) from None
    if steps is not None and min(chosen) > steps:
        raise BadInput(f"--trace-steps {text} names no step of a {steps}-step run",
                       f"choose steps from 1 to {steps}, or raise --steps")
    return text


def with_trace(workload, trace: bool, trace_steps: str | None, script: bool):
    """The workload, traced as asked (checked against its --steps unless a script runs)."""
    return dataclasses.replace(workload, trace_steps=traced_steps(trace, trace_steps, None if script else workload.steps))


def untraced(jobs: list) -> list:
    """Warm-up runs are not traced: their steps are not the comparison's."""
    for job in jobs:
        job.spec.workload = dataclasses.replace(job.spec.workload, trace_steps=None)
    return jobs
