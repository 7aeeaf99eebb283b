"""Rank-0 logs as pandas tables: one row per (run, optimizer step), one per `[phase]` sample, and
each run's summary as a groupby-aggregate over its steps.

A *run* is one rank-0 log and the cell it ran (impl, world size, stage, precision, offload); the
log is read by `logparse`, on the contract's one tokenizer, so a value reads the same here as in
`zero-lab parse` and the tests.

Phase 1: `step_table` lays every run's `[opt_step]` rows beside its cell, in log order, and sets
         the dtypes: the run and the cell's names are categories, the world size, stage, step and
         every `*_bytes` field integers, every other figure a float (a value that is not a number,
         such as a bool, reads as missing). `phase_table` does the same for the `[phase]` samples.
Phase 2: `summarize_steps` reduces each run's rows to one row: memory is the max over steps (each
         step already reports the max over ranks); the step time is the median over the steps
         after start-up (step 1, and more while the times show a transient:
         `step_times.start_up_steps`); communication and throughput are the median without the
         first step, which carries one-time start-up work; the loss is the last step's. A run
         without steps keeps its row, with 0 steps and nothing measured.
Phase 3: `summary_records` turns summary rows into the plain dict summary.json and compare.json
         hold: None for a figure nobody logged; a NaN loss stays NaN, because the run logged it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import pandas as pd

from zero_lab.analysis.runs.logparse import MEMORY_FIELDS, STEP_FIELDS, ParsedLog, is_number
from zero_lab.analysis.runs.speed.step_times import steady_times

CELL_COLUMNS = ("impl", "world_size", "stage", "precision", "offload")
# Every figure an [opt_step] line may carry that a summary reads; other fields follow, sorted.
STEP_COLUMNS = ("step", *STEP_FIELDS, "pre_step_alloc_max_mb", "states_device_mb", "states_host_mb")
CATEGORIES = ("run", "impl", "precision", "offload", "phase", "status", "baseline")
INTEGERS = ("world_size", "stage", "steps", "params", "exit_code", "failed_rank", "rank_exit_code", "skipped_lines")
# Figures reduced over steps: the max (memory), the median after start-up (step time) or the median
# without the first step (communication, throughput).
MAXIMA = (*MEMORY_FIELDS, "states_device_mb", "states_host_mb")
STEADY_MEDIANS = ("comm_mb", "comm_wire_mb", "comm_wire_intra_mb", "comm_wire_inter_mb", "tokens_per_s")
# The order of a run's measured keys in summary.json and compare.json's rows.
SUMMARY_COLUMNS = ("steps", "loss_last", *MEMORY_FIELDS, "step_ms", "comm_mb", "comm_wire_mb",
                   "comm_wire_intra_mb", "comm_wire_inter_mb", "states_device_mb", "states_host_mb", "tokens_per_s")


@dataclass(frozen=True)
class Run:
    """One rank-0 log: `name` identifies it (its run directory, or the log file itself), `cell` maps
    CELL_COLUMNS to values (None where unknown), `status` is summary.json's where there is one."""

    name: str
    parsed: ParsedLog
    cell: dict[str, object] = field(default_factory=dict)
    status: str | None = None


def typed(frame: pd.DataFrame) -> pd.DataFrame:
    """Phase 1's dtypes, column by column; any column not named here that holds only numbers is a float."""
    for name in frame.columns:
        values = frame[name]
        if name in CATEGORIES:
            frame[name] = values.astype("category")
        elif name in INTEGERS or name.endswith("_bytes"):
            frame[name] = numbers(values).astype("Int64")
        elif name == "step":
            frame[name] = values.astype("int64")
        elif name in STEP_COLUMNS or values.map(lambda value: value is None or is_number(value)).all():
            frame[name] = numbers(values).astype("float64")
    return frame


def numbers(values: pd.Series) -> pd.Series:
    """Numbers as they are, anything else (a bool, a word, None) as missing."""
    return pd.to_numeric(values.map(lambda value: value if is_number(value) else None), errors="coerce")


def ordered_columns(leading: tuple[str, ...], records: list[dict]) -> list[str]:
    """The leading columns, then any other field the records carry, sorted."""
    return [*leading, *sorted({key for record in records for key in record} - set(leading))]


def step_table(runs: list[Run]) -> pd.DataFrame:
    """Phase 1: one row per (run, rank-0 `[opt_step]` line), cell columns first."""
    records = [{"run": run.name, **cell_of(run), **row} for run in runs for row in run.parsed.steps]
    return typed(pd.DataFrame.from_records(records, columns=ordered_columns(("run", *CELL_COLUMNS, *STEP_COLUMNS),
                                                                           records)))


def phase_table(runs: list[Run]) -> pd.DataFrame:
    """Phase 1 for `[phase]`: one row per (run, step, phase); nano's category bytes where it logged them."""
    records = [{"run": run.name, **cell_of(run), **row} for run in runs for row in run.parsed.phases]
    leading = ("run", *CELL_COLUMNS, "step", "phase", "live_bytes", "peak_bytes")
    return typed(pd.DataFrame.from_records(records, columns=ordered_columns(leading, records)))


def cell_of(run: Run) -> dict[str, object]:
    return {name: run.cell.get(name) for name in CELL_COLUMNS}


def steady_median(values: pd.Series) -> float:
    """Median without the first value logged (start-up work), unless it is the only one."""
    values = values.dropna()
    return (values.iloc[1:] if len(values) > 1 else values).median()


def steady_step_time(values: pd.Series) -> float:
    """Median step time over the steps after start-up (`step_times.start_up_steps`)."""
    return pd.Series(steady_times(values.dropna().tolist()), dtype="float64").median()


def last_value(values: pd.Series) -> float:
    """The last step's value, NaN included: a NaN loss is what the run logged."""
    return values.iloc[-1] if len(values) else math.nan


def summarize_steps(steps: pd.DataFrame, runs: list[str] | None = None) -> pd.DataFrame:
    """Phase 2: one row per run, indexed by run, in the order of `runs` (default: as they appear)."""
    grouped = steps.groupby("run", sort=False, observed=True)
    summary = grouped.agg(
        steps=("step", "size"),
        loss_last=("loss", last_value),
        **{name: (name, "max") for name in MAXIMA},
        step_ms=("step_ms", steady_step_time),
        **{name: (name, steady_median) for name in STEADY_MEDIANS},
    )
    order = list(runs) if runs is not None else list(summary.index)
    summary = summary.reindex(order)[list(SUMMARY_COLUMNS)]
    summary["steps"] = summary["steps"].fillna(0).astype("int64")
    return summary


def plain(value: object) -> object:
    """A pandas or numpy scalar as the Python value JSON writes; missing (NaN, NA) as None."""
    if value is None or (not isinstance(value, str) and pd.isna(value)):
        return None
    return value.item() if hasattr(value, "item") else value


def summary_records(summary: pd.DataFrame) -> list[dict[str, object]]:
    """Phase 3: summary rows as summary.json's plain values, one dict per run."""
    records = []
    for row in summary.to_dict("records"):
        record = {name: plain(row[name]) for name in SUMMARY_COLUMNS}
        if record["steps"]:
            record["loss_last"] = float(row["loss_last"])
        records.append(record)
    return records


def summarize_run(parsed: ParsedLog) -> dict[str, object]:
    """The measured part of one run's summary.json; its status and cell are the caller's to add."""
    name = "run"
    return summary_records(summarize_steps(step_table([Run(name, parsed)]), [name]))[0]
