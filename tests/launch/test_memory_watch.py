"""The memory watch's rule and figures (zero_lab/launch/memory_watch.py), without launching a run:
when a SIGKILLed rank is called out of memory, the cgroup files it reads (v2 and v1), and its
samples of a real process that holds a known number of bytes."""

from __future__ import annotations

import signal
import subprocess
import sys
import os

import pytest

from zero_lab.launch import memory_watch
from zero_lab.launch.memory_watch import Ceiling, MemoryRecord, MemoryWatch, out_of_memory_message

GB, MB = 2**30, 2**20
SIGKILLED = -signal.SIGKILL


def test_nearly_exhausted_is_less_than_a_tenth_of_the_ceiling_free():
    assert Ceiling("x", 100 * MB, 10 * MB - 1).nearly_exhausted
    assert not Ceiling("x", 100 * MB, 10 * MB).nearly_exhausted


def exhausted_record() -> MemoryRecord:
    record = MemoryRecord()
    record.add({0: int(5.0 * GB), 1: int(4.0 * GB)}, Ceiling("the machine", 23 * GB, 8 * GB))
    record.add({0: int(11.9 * GB), 1: int(9.0 * GB)}, Ceiling("the machine", 23 * GB, int(0.3 * GB)))
    return record


def test_a_rank_sigkilled_while_memory_was_nearly_exhausted_is_named_with_the_figures():
    record = exhausted_record()
    assert record.nearly_exhausted and record.rss_max_mb() == pytest.approx(11.9 * 1024, abs=1)
    assert out_of_memory_message(0, SIGKILLED, record, oom_kills=0) == (
        "killed, most likely out of memory: rank 0 held 11.9 GB resident, 0.3 GB of 23.0 GB was free (the machine)")


def test_no_verdict_for_another_exit_or_plenty_free():
    assert out_of_memory_message(0, 1, exhausted_record(), oom_kills=0) is None  # not a SIGKILL
    assert out_of_memory_message(0, -signal.SIGTERM, exhausted_record(), oom_kills=0) is None
    roomy = MemoryRecord()
    roomy.add({0: 2 * GB}, Ceiling("the machine", 23 * GB, 12 * GB))
    assert out_of_memory_message(0, SIGKILLED, roomy, oom_kills=0) is None  # a SIGKILL from a person


def test_the_containers_own_count_of_oom_kills_decides_even_when_no_sample_was_tight():
    roomy = MemoryRecord()
    roomy.add({1: 2 * GB}, Ceiling("the container's cgroup limit", 4 * GB, 2 * GB))
    message = out_of_memory_message(1, SIGKILLED, roomy, oom_kills=1)
    assert message.startswith("killed, most likely out of memory: rank 1 held 2.0 GB resident")
    assert message.endswith("the container counted 1 out-of-memory kill(s)")


def test_cgroup_v2_limit_usage_and_events(tmp_path):
    (tmp_path / "memory.max").write_text("max\n")
    (tmp_path / "memory.current").write_text(f"{GB}\n")
    (tmp_path / "memory.events").write_text("low 0\nhigh 0\nmax 3\noom 1\noom_kill 2\n")
    assert memory_watch.cgroup_ceiling(tmp_path) is None  # no limit set
    assert memory_watch.cgroup_oom_kills(tmp_path) == 2
    (tmp_path / "memory.max").write_text(f"{4 * GB}\n")
    assert memory_watch.cgroup_ceiling(tmp_path) == Ceiling("the container's cgroup limit", 4 * GB, 3 * GB)


def test_cgroup_v1_limit_usage_and_oom_control(tmp_path):
    v1 = tmp_path / "memory"
    v1.mkdir()
    (v1 / "memory.limit_in_bytes").write_text("9223372036854771712\n")  # v1's "no limit"
    (v1 / "memory.usage_in_bytes").write_text(f"{GB}\n")
    (v1 / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 5\n")
    assert memory_watch.cgroup_ceiling(tmp_path) is None
    assert memory_watch.cgroup_oom_kills(tmp_path) == 5
    (v1 / "memory.limit_in_bytes").write_text(f"{2 * GB}\n")
    assert memory_watch.cgroup_ceiling(tmp_path).available == GB
    assert memory_watch.cgroup_ceiling(tmp_path / "nothing") is None
    assert memory_watch.cgroup_oom_kills(tmp_path / "nothing") == 0


def test_the_tightest_ceiling_is_the_stated_limit_less_the_ranks_resident_bytes(tmp_path):
    ceiling = memory_watch.tightest_ceiling(300 * MB, 256 * MB, tmp_path)
    assert ceiling == Ceiling("--device-memory", 256 * MB, 0)
    assert memory_watch.tightest_ceiling(0, None, tmp_path).name == "the machine"


HOLDER = """
import sys
held = b"x" * (200 * 2**20)  # written, so resident
print("holding", flush=True)
sys.stdin.read()
"""
PARENT = """
import os, subprocess, sys
child = subprocess.Popen([sys.executable, "-c", sys.argv[1]], env={**os.environ, "RANK": "3"}, stdin=sys.stdin)
child.wait()
"""


def test_the_watch_samples_a_ranks_resident_bytes_into_memory_csv(tmp_path):
    """A stand-in for torchrun whose worker (RANK=3) holds 200 MB: the watch's record and memory.csv show it."""
    parent = subprocess.Popen([sys.executable, "-c", PARENT, HOLDER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True)
    try:
        assert parent.stdout.readline().strip() == "holding"
        watch = MemoryWatch(parent, tmp_path / "memory.csv", stated_limit=150 * MB, cgroup_root=tmp_path)
        with open(os.devnull, "w") as sink:
            watch.sample(sink)
        with watch:  # the thread writes memory.csv; leaving the block stops it
            pass
    finally:
        parent.stdin.close()
        parent.wait(timeout=30)
    assert watch.record.rss_max[3] >= 200 * MB and watch.record.nearly_exhausted
    assert watch.record.tightest == Ceiling("--device-memory", 150 * MB, 0)
    rows = (tmp_path / "memory.csv").read_text().splitlines()
    assert rows[0] == memory_watch.CSV_HEADER.strip()
    time_s, rank, rss_mb, available_mb, ceiling_mb, name = rows[1].split(",")
    assert (rank, float(available_mb), float(ceiling_mb), name) == ("3", 0.0, 150.0, "--device-memory")
    assert float(rss_mb) >= 200
    assert watch.out_of_memory(3, SIGKILLED).startswith("killed, most likely out of memory: rank 3 held 2")
