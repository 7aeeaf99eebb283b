"""The one error the workload raises for bad input: a problem and its fix, printed as one line."""

from __future__ import annotations


class WorkloadError(Exception):
    """Bad input found before training: `train.py` prints `error: <problem>. <fix>` and exits 2."""

    def __init__(self, problem: str, fix: str):
        super().__init__(f"{problem}. {fix}")
        self.problem = problem
        self.fix = fix
