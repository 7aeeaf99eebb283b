"""bench/step_transient.py on the tiny preset: after the step that creates the Adam states, a
stage-2 step allocates nothing above what it starts with (docs/throughput.md)."""

from __future__ import annotations

import os
import re
import subprocess
import sys

from tests.scripts import REPO
from tests.ports import free_port


def test_a_stage_2_step_allocates_nothing_above_its_start():
    done = subprocess.run([sys.executable, str(REPO / "bench" / "step_transient.py"), "--model", "tiny", "--steps", "3"],
                          capture_output=True, text=True, timeout=300, cwd=REPO,
                          env={**os.environ, "MASTER_PORT": str(free_port())})
    assert done.returncode == 0, done.stdout + done.stderr[-2000:]
    peaks = re.findall(r"step (\d+): before [\d.]+ MB, peak \+([\d.]+) MB", done.stdout)
    assert [step for step, _ in peaks] == ["1", "2", "3"], done.stdout
    assert [float(peak) for _, peak in peaks[1:]] == [0.0, 0.0], done.stdout
    assert float(peaks[0][1]) > 0  # step 1 creates the Adam states: the tracker sees what a step allocates


def test_the_docs_state_the_benches_goals():
    text = (REPO / "docs" / "throughput.md").read_text()
    assert "**The step's transient is 0 bytes**" in text
    bench = (REPO / "bench" / "step_transient.py").read_text()
    assert re.search(r"GOAL_PCT = 1\.0\b", bench) and "| at most 1% |" in text
