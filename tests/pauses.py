"""A rank paused at a named moment of a launched run (`workload.faults.rank_pause`), found by the test
that waits for it: the rank prints `[rank R paused at MOMENT] pid=P` and waits to be killed."""

from __future__ import annotations

import re
import subprocess
import time
from pathlib import Path

import pytest

PAUSED = re.compile(r"\[rank (?P<rank>\d+) paused at (?P<moment>\S+)\] pid=(?P<pid>\d+)")


def wait_for_pause(run_dir: Path, cli: subprocess.Popen, seen: int, timeout_s: float = 300) -> dict:
    """The next rank that says it paused (in torchrun's per-attempt logs under run_dir): its rank, moment, pid.
    `seen` pauses were found before; the timeout bounds a hang, it does not time the run."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert cli.poll() is None, cli.communicate()
        found = [match.groupdict() for log in sorted((run_dir / "torchrun-logs").rglob("stdout.log"))
                 for match in PAUSED.finditer(log.read_text(errors="replace"))]
        if len(found) > seen:
            return found[seen]
        time.sleep(0.2)
    cli.kill()
    pytest.fail(f"no rank paused within {timeout_s} s")
