"""The layout of a run directory, and reading it back (for `report` and `compare`).

    runs/<run-id>/
        command.txt        the exact torchrun command, shell-quoted
        config.json        the DeepSpeed config this impl was given (stage set for this run)
        config.official.json  for --impl official: what official DeepSpeed received after conversion
        console.log        torchrun's own output and rank 0's stdout, as it streamed
        logs/rank<k>.stdout.log, logs/rank<k>.stderr.log   every local rank's full output
        metrics.csv        one row per [opt_step]
        memory.csv         every rank's resident memory and the memory available, sampled while it ran
        summary.json       the row `compare` reports, plus headers, collectives and warnings
        env.json           versions, device, CPU/GPU model

    runs/<compare-id>/compare.json, and one run directory per cell under runs/<compare-id>/cells/.

A run or comparison gets its directory from `claim`, which creates it and fails if it exists, so
two commands started in the same second can never share one.
"""

from __future__ import annotations

import csv
import errno
import itertools
import json
import os
import re
import shutil
from datetime import datetime
from pathlib import Path

from zero_lab.analysis.logparse import STEP_FIELDS, ParsedLog

SUMMARY = "summary.json"
COMPARE = "compare.json"


def timestamp(now: datetime | None = None) -> str:
    return (now or datetime.now()).strftime("%Y%m%d-%H%M%S")


def cell_name(impl: str, stage: int, world_size: int) -> str:
    return f"w{world_size}-s{stage}-{impl}"


def claim(parent: Path, name: str, numbered: bool = False) -> Path:
    """Create parent/name, which must not exist yet, and return it.

    Creating the directory is the one atomic step: of two commands that computed the same name
    (a default name is a timestamp to the second), exactly one gets it. numbered: the other takes
    name-2, name-3, ... instead; else it gets FileExistsError. A parent that cannot be created
    raises another OSError (NotADirectoryError where a file stands in the way).
    """
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except FileExistsError:  # a file where a directory of the path should be
        raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), str(parent)) from None
    for attempt in itertools.count(1):
        path = parent / (name if attempt == 1 else f"{name}-{attempt}")
        try:
            path.mkdir()
            return path
        except FileExistsError:
            if not numbered:
                raise


def holds_a_run(directory: Path) -> bool:
    """Whether a run started under directory: every launched run writes its summary.json, also
    when it failed or was interrupted."""
    return any(directory.rglob(SUMMARY))


def collect_rank_logs(torchrun_log_dir: Path, destination: Path) -> list[Path]:
    """Move torchrun's `<job>/attempt_<a>/<rank>/std{out,err}.log` to `logs/rank<k>.<stream>.log`."""
    destination.mkdir(parents=True, exist_ok=True)
    moved = []
    for source in sorted(torchrun_log_dir.glob("*/attempt_*/*/std*.log")):
        target = destination / f"rank{source.parent.name}.{source.stem}.log"
        shutil.move(str(source), target)
        moved.append(target)
    shutil.rmtree(torchrun_log_dir, ignore_errors=True)
    return moved


def write_metrics_csv(path: Path, parsed: ParsedLog) -> None:
    extra = sorted({key for row in parsed.steps for key in row} - {"step", *STEP_FIELDS})
    columns = ["step", *STEP_FIELDS, *extra]
    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=columns, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(parsed.steps)


def write_json(path: Path, payload: object) -> None:
    path.write_text(json.dumps(payload, indent=2, default=str) + "\n")


def read_json(path: Path) -> dict:
    return json.loads(path.read_text())


def failure_from_console(console_text: str) -> dict[str, int | None]:
    """torchrun's root-cause block names the failing rank and its exit code."""
    console_text = console_text[console_text.rfind("Root Cause"):]
    rank = re.search(r"rank\s*:\s*(\d+)", console_text)
    code = re.search(r"exitcode\s*:\s*(-?\d+)", console_text)
    return {
        "failed_rank": int(rank.group(1)) if rank else None,
        "rank_exit_code": int(code.group(1)) if code else None,
    }


def log_tail(paths: list[Path], lines: int = 20) -> str:
    """The last lines of the first stderr log that has any, else of the first log."""
    candidates = sorted(paths, key=lambda p: (".stderr" not in p.name, p.name))
    for path in candidates:
        text = path.read_text(errors="replace").strip()
        if text:
            return "\n".join(text.splitlines()[-lines:])
    return ""


def find_summaries(paths: list[Path]) -> list[Path]:
    """Every summary.json in or below the given run/compare directories, in a stable order."""
    found = []
    for path in paths:
        if (path / SUMMARY).is_file():
            found.append(path / SUMMARY)
        else:
            found.extend(sorted(path.rglob(SUMMARY)))
    return found


def losses_of(summary: dict) -> dict[int, float]:
    """Per-step losses as saved in summary.json (JSON keys are strings)."""
    return {int(step): float(loss) for step, loss in summary.get("losses", {}).items()}


def rank0_log(run_dir: Path) -> Path:
    """Where a run's `[opt_step]` lines are: rank 0's stdout, else torchrun's console (a run cut
    off before its rank logs were gathered)."""
    rank0 = run_dir / "logs" / "rank0.stdout.log"
    return rank0 if rank0.is_file() else run_dir / "console.log"
