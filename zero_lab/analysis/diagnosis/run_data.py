"""What the doctor reads of a run or a comparison: only the files the run wrote.

A run directory (`analysis.runs.rundir`): summary.json (status, measured and predicted figures, headers),
rank 0's log (every `[opt_step]`, `[phase]` and `[ckpt]` line), config.json (the config the engine
was given) and logs/collectives-rank<N>.bin (each rank's flight record, `collective_record`). A
compare directory: compare.json and a run directory per cell under cells/.

Phase 1: `load(paths)` sorts the paths into runs and comparisons (anything else is a ValueError
         naming the path and what to pass instead).
Phase 2: each run is read into a `RunData`; a flight record that cannot be read is noted, not fatal.
"""

from __future__ import annotations

import json
import signal
from dataclasses import dataclass, field
from pathlib import Path

from zero_lab.analysis.runs import rundir
from zero_lab.analysis.memory.activation_memory import DecoderShape, decoder_shape
from zero_lab.analysis.runs.logparse import ParsedLog, is_number, parse_file
from zero_lab.workload.meters.collective_record import NotARecord, Record, read_records

# Signals that end a rank from outside: the out-of-memory killer, a scheduler, a user, a lost node.
FROM_OUTSIDE = (signal.SIGKILL, signal.SIGTERM, signal.SIGHUP, signal.SIGINT)


@dataclass
class RunData:
    """One run as the doctor sees it."""

    directory: Path
    summary: dict
    log: ParsedLog
    config: dict
    records: dict[int, Record] = field(default_factory=dict)
    unreadable: list[str] = field(default_factory=list)  # files that are there but cannot be read

    @property
    def name(self) -> str:
        return str(self.directory)

    @property
    def impl(self) -> str:
        return str(self.summary.get("impl") or self.log.zero.get("impl") or "?")

    @property
    def stage(self) -> int | None:
        stage = self.summary.get("stage", self.log.zero.get("stage"))
        return int(stage) if is_number(stage) else None

    @property
    def world_size(self) -> int | None:
        size = self.summary.get("world_size") or self.log.zero.get("world_size")
        return int(size) if is_number(size) else None

    @property
    def precision(self) -> str:
        return str(self.summary.get("precision") or self.log.model.get("ds_precision") or "fp32")

    @property
    def label(self) -> str:
        """'nano stage 3 (W=2)': how evidence names the run."""
        return f"{self.impl} stage {self.stage} (W={self.world_size})"

    def zero_key(self, key: str, default=None):
        """A `zero_optimization` key of the config the engine was given (its default when unset)."""
        return (self.config.get("zero_optimization") or {}).get(key, default)

    def steps(self) -> list[dict]:
        return self.log.steps

    def shape(self) -> DecoderShape | None:
        """The model's decoder shape (a preset, or a directory's config.json), None when it has none
        this machine can read: `explain`'s arithmetic then has nothing to work on."""
        try:
            return decoder_shape(str(self.log.model.get("name")))
        except ValueError:
            return None

    def ranks_saying(self, text: str) -> list[int]:
        """The ranks whose stderr log (logs/rank<k>.stderr.log) contains `text`."""
        ranks = []
        for path in sorted((self.directory / "logs").glob("rank*.stderr.log")):
            rank = path.name.removeprefix("rank").split(".")[0]
            if rank.isdigit() and text in path.read_text(errors="replace"):
                ranks.append(int(rank))
        return ranks

    def stderr_of(self) -> dict[int, str]:
        """Each rank's stderr log (logs/rank<k>.stderr.log), by rank."""
        texts = {}
        for path in sorted((self.directory / "logs").glob("rank*.stderr.log")):
            rank = path.name.removeprefix("rank").split(".")[0]
            if rank.isdigit():
                texts[int(rank)] = path.read_text(errors="replace")
        return texts

    def killing_signal(self) -> signal.Signals | None:
        """SIGKILL, SIGTERM, SIGHUP or SIGINT when the failed rank (or the launch) ended by it: a
        signal from outside the training (`diagnosis.killed`), not one the rank raised itself."""
        code = self.summary.get("rank_exit_code")
        if self.summary.get("status") != "failed" or not is_number(code) or code >= 0:
            return None
        number = -int(code)
        return signal.Signals(number) if number in {int(one) for one in FROM_OUTSIDE} else None

    def ending(self) -> str:
        """How the run ended, in words: 'failed: rank 1 exited with -6 (SIGABRT)', 'stalled: ...'."""
        status, summary = self.summary.get("status"), self.summary
        if summary.get("error"):
            error = str(summary["error"])
            return error if error.startswith(f"{status}:") else f"{status}: {error}"  # a stall's line says it
        code = summary.get("rank_exit_code")
        if status == "failed" and is_number(code):
            return f"failed: {rundir.who_exited(summary.get('failed_rank'), code)}"
        return str(status)


@dataclass
class ComparisonData:
    """One `zero-lab compare`: what it saved, and its cells as runs."""

    directory: Path
    saved: dict
    runs: list[RunData]


def read_config(directory: Path) -> dict:
    path = directory / "config.json"
    try:
        return json.loads(path.read_text()) if path.is_file() else {}
    except (OSError, ValueError):
        return {}


# What a run directory holds once its ranks have started, before the launcher writes summary.json.
STARTED = ("console.log", "logs")
UNFINISHED = ("the command that launched it ended before it wrote summary.json (it was killed, or the machine "
              "stopped): what the ranks wrote is read as it is")


def load_run(directory: Path) -> RunData:
    """Phase 2 for one run directory (one without summary.json: what its ranks wrote, as unfinished)."""
    summary = rundir.read_json(directory / rundir.SUMMARY) if (directory / rundir.SUMMARY).is_file() else {
        "status": "unfinished", "error": UNFINISHED}
    log_path = rundir.rank0_log(directory)
    log = parse_file(log_path) if log_path.is_file() else ParsedLog()
    run = RunData(directory, summary, log, read_config(directory))
    logs = directory / "logs"
    if logs.is_dir():
        try:
            run.records = read_records(logs)
        except (NotARecord, OSError) as problem:
            run.unreadable.append(str(problem))
    return run


def load(paths: list[Path]) -> tuple[list[RunData], list[ComparisonData]]:
    """Phase 1: (the run directories given, the comparisons given with their cells)."""
    runs, comparisons = [], []
    for path in paths:
        if (path / rundir.SUMMARY).is_file():
            runs.append(load_run(path))
        elif (path / rundir.COMPARE).is_file():
            cells = sorted((path / "cells").glob(f"*/{rundir.SUMMARY}"))
            comparisons.append(ComparisonData(path, rundir.read_json(path / rundir.COMPARE),
                                              [load_run(cell.parent) for cell in cells]))
        elif any((path / name).exists() for name in STARTED):  # its launcher died before the summary
            runs.append(load_run(path))
        elif path.exists():
            raise ValueError(f"{path} is neither a run directory (summary.json) nor a compare directory "
                             f"(compare.json). Pass what `zero-lab run` or `zero-lab compare` wrote")
        else:
            raise ValueError(f"{path} does not exist. Pass a run directory or a compare directory (runs/...)")
    return runs, comparisons
