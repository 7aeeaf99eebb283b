"""The Python API for notebooks: logs, runs and comparisons as pandas DataFrames.

    import zero_lab
    steps = zero_lab.load_steps("runs/compare-*")        # one row per (run, rank-0 step)
    steps.groupby(["impl", "stage"]).loss.last()
    runs, deltas = zero_lab.load_comparison("runs/compare-20260101-120000")

`zero_lab` exposes these functions lazily, so `import zero_lab` (and the CLI's start-up) loads
no pandas. docs/analysis.md walks through them.

Phase 1: `find_runs` turns paths and glob patterns into runs: a rank-0 log file is one run, its
         cell read from its own `[zero]` and `[model]` headers; a run directory is one run, its
         cell from summary.json; a compare directory is the runs under its `cells/` (its warm-ups
         and resume runs left out).
Phase 2: `tables` lays them out (`load_steps`, `load_phases`) or reduces them (`load_runs`);
         `load_comparison` reads what `zero-lab compare` saved in compare.json.
"""

from __future__ import annotations

import glob
import os
from pathlib import Path
from typing import Iterable, Union

import pandas as pd

from zero_lab.analysis.runs import rundir
from zero_lab.analysis.runs.logparse import ParsedLog, parse_file
from zero_lab.analysis.runs.tables import (CELL_COLUMNS, SUMMARY_COLUMNS, Run, phase_table, step_table, summarize_steps,
                                      typed)

PathsOrGlobs = Union[str, os.PathLike, Iterable[Union[str, os.PathLike]]]


def expand(paths_or_globs: PathsOrGlobs) -> list[Path]:
    """Every path, each glob pattern replaced by what it matches (sorted); a pattern or path that
    matches nothing is a FileNotFoundError naming it."""
    items = [paths_or_globs] if isinstance(paths_or_globs, (str, os.PathLike)) else list(paths_or_globs)
    found = []
    for item in items:
        text = os.fspath(item)
        matches = sorted(glob.glob(text)) if glob.has_magic(text) else ([text] if os.path.exists(text) else [])
        if not matches:
            raise FileNotFoundError(f"{text} matches no file or directory: pass rank-0 logs, run directories "
                                    f"or compare directories (runs/compare-*)")
        found += [Path(match) for match in matches]
    return found


def cell_from_headers(parsed: ParsedLog) -> dict[str, object]:
    """A bare log's cell, from its own `[zero]`, `[rank]` and `[model]` lines (None where it lacks one)."""
    zero = parsed.zero
    offload = None
    if "offload_param" in zero or "offload_optimizer" in zero:
        offload = ("param" if zero.get("offload_param") == "cpu"
                   else "optimizer" if zero.get("offload_optimizer") == "cpu" else "none")
    return {"impl": zero.get("impl"), "world_size": zero.get("world_size") or parsed.rank.get("world_size"),
            "stage": zero.get("stage"), "precision": parsed.model.get("ds_precision"), "offload": offload}


def run_of_directory(directory: Path) -> Run:
    summary = rundir.read_json(directory / rundir.SUMMARY)
    log = rundir.rank0_log(directory)
    parsed = parse_file(log) if log.is_file() else ParsedLog()
    return Run(str(directory), parsed, {name: summary.get(name) for name in CELL_COLUMNS}, summary.get("status"))


def is_compare_directory(directory: Path) -> bool:
    return (directory / rundir.COMPARE).is_file() or (directory / "cells").is_dir()


def find_runs(paths_or_globs: PathsOrGlobs) -> list[Run]:
    """Phase 1: the runs the paths name, in the order given (a compare directory's cells sorted)."""
    runs = []
    for path in expand(paths_or_globs):
        if path.is_file():
            parsed = parse_file(path)
            runs.append(Run(str(path), parsed, cell_from_headers(parsed)))
        elif (path / rundir.SUMMARY).is_file():
            runs.append(run_of_directory(path))
        elif is_compare_directory(path):
            runs += [run_of_directory(cell.parent) for cell in sorted((path / "cells").glob(f"*/{rundir.SUMMARY}"))]
        else:
            raise ValueError(f"{path} is neither a run directory (summary.json) nor a compare directory "
                             f"(compare.json): pass what `zero-lab run` or `zero-lab compare` wrote, or a rank-0 log")
    return runs


def load_steps(paths_or_globs: PathsOrGlobs) -> pd.DataFrame:
    """One row per (run, rank-0 optimizer step): `run`, the cell (impl, world_size, stage,
    precision, offload), `step`, `loss` and every other `[opt_step]` field (docs/log-format.md).

    paths_or_globs: rank-0 logs, run directories or compare directories, or glob patterns of them.
    """
    return step_table(find_runs(paths_or_globs))


def load_phases(paths_or_globs: PathsOrGlobs) -> pd.DataFrame:
    """One row per `[phase]` sample: `run`, the cell, `step`, `phase`, `live_bytes`, `peak_bytes`
    and, for nano, its memory by category (`*_bytes`)."""
    return phase_table(find_runs(paths_or_globs))


def load_runs(paths_or_globs: PathsOrGlobs) -> pd.DataFrame:
    """One row per run: `run`, the cell, `status` (summary.json's; missing for a bare log) and the
    summary `compare` reports (max memory, median step time without step 1, last loss, ...),
    computed here from the steps. A run without steps keeps its row with `steps` 0."""
    runs = find_runs(paths_or_globs)
    summary = summarize_steps(step_table(runs), [run.name for run in runs])
    cells = pd.DataFrame.from_records([{"run": run.name, **run.cell, "status": run.status} for run in runs],
                                      columns=["run", *CELL_COLUMNS, "status"])
    frame = pd.concat([cells, summary.reset_index(drop=True)], axis=1)
    return typed(frame[["run", *CELL_COLUMNS, "status", *SUMMARY_COLUMNS]])


def load_comparison(compare_dir: str | os.PathLike) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(runs, deltas) of one `zero-lab compare`, as it saved them in compare.json (docs/compare-json.md):
    runs has one row per run with its `run` directory under `cells/` (the `run` of `load_steps`),
    deltas one row per (world size, stage) compared."""
    directory = Path(compare_dir)
    if not (directory / rundir.COMPARE).is_file():
        raise FileNotFoundError(f"{directory} has no {rundir.COMPARE}: pass a directory `zero-lab compare` wrote "
                                f"(runs/compare-*), or load its runs with load_runs")
    saved = rundir.read_json(directory / rundir.COMPARE)
    runs = pd.DataFrame.from_records(saved["rows"])
    runs.insert(0, "run", [str(directory / "cells" / rundir.cell_name(row["impl"], row["stage"], row["world_size"]))
                           for row in saved["rows"]])
    deltas = pd.DataFrame.from_records(saved["deltas"])
    return typed(runs), typed(deltas)
