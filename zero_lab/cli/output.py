"""Printing: Rich tables and progress on stderr-safe consoles, and strict JSON on stdout."""

from __future__ import annotations

import json
import math
import sys

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

# Off a terminal (CI logs, pipes) Rich would assume 80 columns and squeeze the tables; a table is no
# wider than its cells, and the widest, compare's runs with the node split, takes about 165.
stdout = Console(soft_wrap=True, width=None if sys.stdout.isatty() else 200)
stderr = Console(stderr=True, soft_wrap=True)


def progress_bar(disable: bool = False) -> Progress:
    """Optimizer steps per run with the live loss; on stderr so stdout stays machine-readable."""
    return Progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
        TextColumn("loss {task.fields[loss]}"), TimeElapsedColumn(), console=stderr, disable=disable,
    )


def print_table(headers: list[str], body: list[list[str]], title: str | None = None, numeric: bool = True) -> None:
    """Numeric tables right-align every column but the first."""
    table = Table(title=title, title_justify="left")
    for index, header in enumerate(headers):
        table.add_column(header, justify="right" if numeric and index else "left")
    for cells in body:
        table.add_row(*cells)
    stdout.print(table)


def json_safe(value: object) -> object:
    """Non-finite floats become null: strict JSON has no NaN or Infinity."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {key: json_safe(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(item) for item in value]
    return value


def print_json(payload: object) -> None:
    print(json.dumps(json_safe(payload), indent=2, allow_nan=False, default=str))
