"""`zero-lab parse` (logs to one table) and `zero-lab report` (run directories to markdown).

    zero-lab parse runs/*/logs/rank0.stdout.log log/nano-node2.log --format csv
    zero-lab parse runs/*/logs/rank0.stdout.log --format parquet > steps.parquet
    zero-lab report runs/compare-20260101-120000 --out reports/cpu-demo.md
"""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path
from typing import Annotated, List

import typer

from zero_lab.analysis.runs import rundir
from zero_lab.analysis.runs.logparse import STEP_FIELDS, ParsedLog, parse_file
from zero_lab.cli import output
from zero_lab.cli.errors import BadInput, check_choice, check_not_negative, one_line_errors
from zero_lab.cli.reporting import write_report

PARSE_FORMATS = ("table", "csv", "json", "parquet")
SUMMARY_KEYS = ("world_size", "stage", "impl", "status")  # what a report needs of every summary


def existing(paths: list[Path], what: str, directories: bool) -> list[Path]:
    """The paths, each existing and a directory (directories) or a file (not directories), or BadInput."""
    for path in paths:
        if not path.exists():
            raise BadInput(f"{what} {path} does not exist", "check the path")
        if directories and not path.is_dir():
            raise BadInput(f"{what} {path} is a file, not a directory", "pass run or compare directories")
        if not directories and path.is_dir():
            raise BadInput(f"{what} {path} is a directory", "pass log files, e.g. DIR/logs/rank0.stdout.log")
    return paths


def read_summary(path: Path) -> dict:
    """A saved summary.json, or BadInput naming it: cut off, binary, unreadable, or not a run's."""
    try:
        summary = rundir.read_json(path)  # not UTF-8, not JSON, not an object: a ValueError naming the file
    except ValueError as error:
        raise BadInput(str(error)) from None
    except OSError as error:
        problem = f"cannot be read ({error.strerror})"
    else:
        missing = [key for key in SUMMARY_KEYS if not isinstance(summary, dict) or key not in summary]
        if not missing:
            return summary
        problem = f"is not a run's summary (no {', '.join(missing)})"
    raise BadInput(f"{path} {problem}", "move that run directory aside (or run it again) and report again")


def cell(value: object) -> str:
    """A table cell: empty where a log has no such figure."""
    return "" if value is None or (isinstance(value, float) and math.isnan(value)) else str(value)


@one_line_errors
def parse(
    logs: Annotated[List[Path], typer.Argument(help="Rank-0 logs: zero-lab's or the seed's.")],
    format: Annotated[str, typer.Option(help="table, csv, json or parquet (binary, to a redirected stdout; "
                                             "needs pyarrow).")] = "table",
) -> None:
    """Parse training logs into one row per optimizer step (garbled lines are skipped and counted)."""
    check_choice(format, "--format", PARSE_FORMATS)
    if format == "parquet":
        check_parquet_writable()
    parsed = {str(path): parse_file(path) for path in existing(logs, "log", directories=False)}
    for path, log in parsed.items():
        if log.found_nothing():
            raise BadInput(f"no log lines found in {path} (no [zero], [model], [opt_step], [comm] or [warn] line)",
                           "pass training logs, e.g. runs/<run>/logs/rank0.stdout.log")
    if format == "json":
        output.print_json({"logs": [{"path": path, "zero": log.zero, "model": log.model, "steps": log.steps,
                                     "phases": log.phases, "comm": log.comm, "warnings": log.warnings,
                                     "skipped_lines": log.skipped_lines}
                                    for path, log in parsed.items()]})
        return
    steps = parsed_steps(parsed)
    if format == "csv":
        steps.to_csv(sys.stdout, index=False, lineterminator="\n")
    elif format == "parquet":
        steps.to_parquet(sys.stdout.buffer, index=False)
    else:
        shown = [column for column in ("log", "step", *STEP_FIELDS) if steps[column].notna().any()]
        output.print_table(shown, [[cell(value) for value in row] for row in steps[shown].itertuples(index=False)])
    for path, log in parsed.items():
        if log.skipped_lines:
            output.stderr.print(f"{path}: skipped {log.skipped_lines} garbled line(s)", markup=False)


def parsed_steps(parsed: dict[str, ParsedLog]):
    """The step table of the logs (analysis.runs.tables), `log` first, then the step and its figures,
    the cell (from each log's own headers) last."""
    from zero_lab.analysis.runs.frames import cell_from_headers  # pandas: only for a table
    from zero_lab.analysis.runs.tables import CELL_COLUMNS, Run, step_table

    steps = step_table([Run(path, log, cell_from_headers(log)) for path, log in parsed.items()])
    steps = steps.rename(columns={"run": "log"})
    return steps[["log", *(column for column in steps.columns if column not in ("log", *CELL_COLUMNS)), *CELL_COLUMNS]]


def check_parquet_writable() -> None:
    """Parquet needs pyarrow, and a binary stream: not a terminal."""
    if importlib.util.find_spec("pyarrow") is None:
        raise BadInput("--format parquet needs the pyarrow package, which is not installed",
                       "pip install pyarrow, or use --format csv")
    if sys.stdout.isatty():
        raise BadInput("--format parquet writes binary data, not for a terminal",
                       "redirect it to a file: zero-lab parse LOG... --format parquet > steps.parquet")


@one_line_errors
def report(
    directories: Annotated[List[Path], typer.Argument(help="Run or compare directories (searched for summary.json).")],
    out: Annotated[Path, typer.Option(help="Markdown file to write; PNG plots go beside it.")] = Path("reports/report.md"),
    impls: Annotated[str, typer.Option(help="Impl order: the first is compared against the second.")] = "nano,official",
    loss_tol: Annotated[float | None, typer.Option(help="Max per-step loss difference for parity.")] = None,
) -> None:
    """Write a markdown report (tables, environment, config differences, plots) from saved runs."""
    check_not_negative(loss_tol, "--loss-tol")
    summaries = [read_summary(path) for path in rundir.find_summaries(existing(directories, "directory", directories=True))]
    summaries = [summary for summary in summaries if "warmup" not in Path(summary.get("run_dir", "")).parts]
    if not summaries:
        raise BadInput("no summary.json under the given directories", "pass directories written by run or compare")
    from zero_lab.analysis.compare.comparison import build_comparison  # pandas: only when a report is written

    comparison = build_comparison(summaries, impls.split(","), loss_tol)
    write_report(comparison, summaries, out)
    output.stderr.print(f"wrote {out}", markup=False)
