"""The job dies with the CLI (issue 17, finding 5): torchrun runs in a session of its own, so a
SIGKILLed CLI (an OOM killer, a CI runner, gpu-check's budget) used to leave it and its ranks
training on. `child_dies_with_parent`, torchrun's preexec_fn, asks Linux for SIGTERM instead."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from tests.scripts import REPO

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="a Linux parent-death signal")

# The CLI's part: start a child in a session of its own, as torchrun_job does, and say its pid.
PARENT = textwrap.dedent("""
    import subprocess, sys
    from zero_lab.launch import torchrun
    child = subprocess.Popen([sys.executable, "-c", sys.argv[1]], stdout=subprocess.PIPE, text=True,
                             start_new_session=True, preexec_fn=torchrun.child_dies_with_parent if sys.argv[2] == "1" else None)
    print(child.pid, child.stdout.readline().strip(), flush=True)
    child.wait()
""")
# torchrun's part: say it runs, then wait for a signal (SIGTERM's default action ends it).
CHILD = textwrap.dedent("""
    import time
    print("ready", flush=True)
    while True:
        time.sleep(3600)
""")


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as stat:  # a zombie has ended too (its reaper is init)
            return stat.read().split(")")[-1].split()[0] == "Z"
    except FileNotFoundError:  # reaped between the two looks
        return True


def start(tied: bool) -> tuple[subprocess.Popen, int]:
    parent = subprocess.Popen([sys.executable, "-c", PARENT, CHILD, "1" if tied else "0"], stdout=subprocess.PIPE,
                              text=True, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    pid, ready = parent.stdout.readline().split()
    assert ready == "ready"  # the child's SIGTERM handler is in place: the named moment
    return parent, int(pid)


def wait_until_gone(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if gone(pid):
            return True
        time.sleep(0.05)
    return gone(pid)


def test_a_sigkilled_parent_takes_its_child_down():
    parent, child = start(tied=True)
    parent.kill()
    parent.wait()
    assert wait_until_gone(child, 60), f"child {child} outlived its SIGKILLed parent"


def test_without_the_tie_the_child_is_orphaned():
    """The defect as it was, so the test above cannot pass for another reason."""
    parent, child = start(tied=False)
    try:
        parent.kill()
        parent.wait()
        assert not wait_until_gone(child, 1.0)
    finally:
        os.kill(child, signal.SIGKILL)
