"""The one error the workload raises for bad input: a problem and its fix, printed as one line."""

from __future__ import annotations


class WorkloadError(Exception):
    """Bad input: `train.py` prints `error: <problem>. <fix>` and exits 2."""

    def __init__(self, problem: str, fix: str):
        super().__init__(f"{problem}. {fix}")
        self.problem = problem
        self.fix = fix

    @classmethod
    def from_nano(cls, error: Exception, where: str = "") -> WorkloadError:
        """nano's NanoConfigError reads "<problem>; <fix>" (a few carry no fix)."""
        problem, _, fix = first_line(error).partition("; ")
        return cls(f"{where}{problem}", fix[:1].upper() + fix[1:] or "Fix the config")


def first_line(error: Exception) -> str:
    """An exception's message as one line without a closing period (libraries' may span several; a
    first line ending in ':' introduces the reason, which is kept after it)."""
    lines = [line.strip() for line in str(error).strip().splitlines() if line.strip()]
    if len(lines) > 1 and lines[0].endswith(":"):
        lines = [f"{lines[0]} {lines[1]}"]
    return (lines[0] if lines else type(error).__name__).rstrip(".")
