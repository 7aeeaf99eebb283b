"""What `--trace` asks of a run, passed from the CLI to every rank: which steps, and where the files go.

The launcher sets two environment variables, read by the harness and by a `--script` run's
client alike (no torch here: the CLI checks --trace-steps with the same parser before any launch):
    ZERO_LAB_TRACE         the directory each rank writes its files into (<run dir>/trace);
    ZERO_LAB_TRACE_STEPS   the optimizer steps traced: "1-3", "2,4" or "2-3,6" (1 is the first step).
Each rank writes `trace-rank<N>.json` (Chrome's trace-event format) and
`memory-snapshot-rank<N>.pickle` (the dict `torch.cuda.memory._snapshot()` returns); docs/trace.md.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

TRACE_DIRECTORY_ENVIRONMENT = "ZERO_LAB_TRACE"
TRACE_STEPS_ENVIRONMENT = "ZERO_LAB_TRACE_STEPS"
TRACE_DIRECTORY = "trace"  # inside the run directory
DEFAULT_TRACE_STEPS = "1-3"  # the first K steps: the files stay bounded however long the run
STEPS_FIX = "give steps as 2-3, 1,4 or 2-3,6 (1 is the first optimizer step)"


def trace_path(directory: Path, rank: int) -> Path:
    return Path(directory) / f"trace-rank{rank}.json"


def snapshot_path(directory: Path, rank: int) -> Path:
    return Path(directory) / f"memory-snapshot-rank{rank}.pickle"


def parse_steps(text: str) -> frozenset[int]:
    """The steps "2-3,6" names; ValueError with the problem for anything else (empty, 0, 3-2)."""
    steps: set[int] = set()
    for part in text.replace(" ", "").split(","):
        first, dash, last = part.partition("-")
        if not (first.isdigit() and (last.isdigit() or not dash)):
            raise ValueError(f"--trace-steps {text!r}: {part!r} is not a step or a range of steps")
        low, high = int(first), int(last or first)
        if low < 1 or high < low:
            raise ValueError(f"--trace-steps {text!r}: {part!r} names no step (steps count from 1, ranges go up)")
        steps.update(range(low, high + 1))
    return frozenset(steps)


@dataclass(frozen=True)
class TraceRequest:
    """One rank's part of `--trace`: where its files go and the steps it traces."""

    directory: Path
    steps: frozenset[int]

    @classmethod
    def from_environment(cls, environ=os.environ) -> "TraceRequest | None":
        """The request the launcher passed (None: no --trace)."""
        directory = environ.get(TRACE_DIRECTORY_ENVIRONMENT)
        if not directory:
            return None
        return cls(Path(directory), parse_steps(environ.get(TRACE_STEPS_ENVIRONMENT) or DEFAULT_TRACE_STEPS))


def trace_environment(run_dir: Path, steps: str | None) -> dict[str, str]:
    """The launcher's side: the variables for a run traced over `steps` (None: not traced)."""
    if steps is None:
        return {}
    return {TRACE_DIRECTORY_ENVIRONMENT: str(Path(run_dir).resolve() / TRACE_DIRECTORY),
            TRACE_STEPS_ENVIRONMENT: steps}
