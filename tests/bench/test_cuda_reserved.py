"""bench/cuda_reserved.py on the tiny preset: a CPU run's allocations, from the model's move to the device to
its last step, replay through the caching allocator's rules (reports/cuda-reserved.md is this bench on
qwen3-0.6b, beside the GPU's figures)."""

from __future__ import annotations

import re
import subprocess
import sys

from tests.scripts import REPO


def test_a_tiny_runs_allocations_replay_into_segments_that_hold_its_peak():
    done = subprocess.run([sys.executable, str(REPO / "bench" / "cuda_reserved.py"), "--model", "tiny",
                           "--impls", "fsdp2", "--stages", "2", "--steps", "2", "--segments"],
                          capture_output=True, text=True, timeout=600, cwd=REPO)
    assert done.returncode == 0, done.stdout + done.stderr[-2000:]
    (row,) = re.findall(r"^fsdp2\s+2\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)", done.stdout, re.MULTILINE)
    peak, reserved, ratio = map(float, row)
    assert 0 < peak <= reserved and ratio == round(reserved / peak, 3)
    # the model is built in the host's memory: on a GPU its move allocates what the build left alive
    assert "the model's move to the device" in done.stdout
    segments = re.findall(r"^\s+([\d.]+) MB in\s+\d+ segments", done.stdout, re.MULTILINE)
    assert sum(map(float, segments)) == reserved  # every segment held is listed
