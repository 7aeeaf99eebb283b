"""The GPU tests rehearsed on CPU (tests/gpu/__init__.py): the same bodies under gloo with the host
for the GPU, so one that would fail on its first GPU run for a reason CPU shares fails here first
(the rehearsal found two: reading a sharded stage-3 parameter without gathering it, and the
zero.Init test's decay groups)."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from tests.gpu import REHEARSAL_ENVIRONMENT
from tests.scripts import REPO


@pytest.mark.slow  # a pytest of its own: torch's import and the tests' worlds of one
def test_the_gpu_tests_pass_when_rehearsed_on_cpu():
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-m", "gpu", "-p", "no:cacheprovider", "tests/gpu"],
                          capture_output=True, text=True, cwd=REPO, timeout=600,
                          env={**os.environ, REHEARSAL_ENVIRONMENT: "1", "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"})
    summary = done.stdout.strip().splitlines()[-1]
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    passed = int(re.search(r"(\d+) passed", summary).group(1))
    skipped = re.search(r"(\d+) skipped", summary)
    assert "failed" not in summary and "error" not in summary and passed > 2 * int(skipped.group(1) if skipped else 0)
