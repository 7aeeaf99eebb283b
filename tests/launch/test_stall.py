"""The stall watch on its own: the line it reports, and stopping a process that makes no progress."""

import subprocess
import sys
import time

from zero_lab.launch.torchrun_job import stop_process_tree
from zero_lab.launch.stall import StallWatch, stall_message


def test_the_stall_line_names_every_rank_with_its_process_state():
    line = stall_message(30.0, 2, 5, {1: "stopped", 0: "sleeping"})
    assert line == ("stalled: no [opt_step] progress for 30 s after step 2 of 5 (--stall-timeout 30); "
                    "ranks that stopped reporting: 0 (sleeping), 1 (stopped)")
    assert "before step 1 of 5" in stall_message(1.5, 0, 5, {}) and stall_message(1.5, 0, 5, {}).endswith("none running")


def test_the_watch_stops_a_silent_process_and_leaves_a_progressing_one():
    silent = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    started = time.monotonic()
    with StallWatch(silent, 1.0, 5, stop_process_tree) as watch:
        silent.wait(timeout=30)
    assert watch.message.startswith("stalled: no [opt_step] progress for 1 s before step 1 of 5")
    assert time.monotonic() - started < 45 and silent.returncode is not None, "stopped long before its 60 s sleep ended"

    busy = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3)"], start_new_session=True)
    with StallWatch(busy, 5.0, 5, stop_process_tree) as watch:
        while busy.poll() is None:
            watch.progressed(1)
            time.sleep(0.2)
    assert watch.message is None and busy.returncode == 0

    unwatched = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(2)"], start_new_session=True)
    with StallWatch(unwatched, 0.0, 5, stop_process_tree) as watch:
        unwatched.wait(timeout=30)
    assert watch.message is None and unwatched.returncode == 0, "--stall-timeout 0 watches nothing"
