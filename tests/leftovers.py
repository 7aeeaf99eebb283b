"""The processes a test of the CLI leaves behind when it fails, killed after it: an autouse fixture for
the modules that start `zero-lab` and torchrun themselves (import it into the module)."""

import psutil
import pytest


@pytest.fixture(autouse=True)
def leftovers_killed(tmp_path):
    """A failing test may leave the command, torchrun or a worker running: each names tmp_path."""
    yield
    for process in psutil.process_iter(["cmdline"]):
        if any(str(tmp_path) in part for part in process.info["cmdline"] or []):
            process.kill()
