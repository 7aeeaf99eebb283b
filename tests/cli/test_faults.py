"""Faults as users meet them, against the real `zero-lab` process: a stop signal from `timeout`, a
cancelled CI job or a closed terminal, Ctrl-C while the command is still starting, and a rank that
stops (SIGSTOP) so that the run makes no more progress.

Each test starts the command in a process of its own. Most run it with a stand-in training script
(rank 0 logs one step, then every rank sleeps), so they need torchrun but no model; the CLI,
torchrun and the process groups are the real ones. The stopped-rank test trains the real harness.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from zero_lab.launch import moments
from tests.leftovers import leftovers_killed  # noqa: F401 (autouse: each test kills what it leaves)

pytestmark = pytest.mark.slow

ZERO_LAB = str(Path(sys.executable).with_name("zero-lab"))
# The real entry point, with harness/train.py swapped for the script given as the first argument.
WITH_SCRIPT = ("import sys; from pathlib import Path; from zero_lab.launch import torchrun; "
               "torchrun.TRAIN_SCRIPT = Path(sys.argv.pop(1)); from zero_lab.cli.entry import main; main()")
SLEEPY_TRAIN = """
import os, time
if os.environ["RANK"] == "0":
    print("[zero] world_size=2", flush=True)
    print("[opt_step 1] loss=5.0 alloc_max_mb=1.0", flush=True)
time.sleep(120)
"""
WORKLOAD = ["--gpus", "2", "--device", "cpu", "--model", "tiny", "--steps", "3"]


def start_with_sleepy_training(tmp_path: Path, *arguments: str) -> subprocess.Popen:
    script = tmp_path / "sleepy_train.py"
    script.write_text(SLEEPY_TRAIN)
    return subprocess.Popen([sys.executable, "-c", WITH_SCRIPT, str(script), *arguments],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_for_first_step(out: Path, command: subprocess.Popen, timeout_s: float = 180) -> list[psutil.Process]:
    """Once a console.log under out shows step 1: torchrun and its workers (all descendants)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert command.poll() is None, command.communicate()
        if any("[opt_step 1]" in log.read_text() for log in out.rglob("console.log")):
            family = psutil.Process(command.pid).children(recursive=True)
            assert len(family) >= 3, family  # torchrun and two workers
            return family
        time.sleep(0.2)
    command.kill()
    pytest.fail(f"no [opt_step 1] within {timeout_s} s")


def still_running(family: list[psutil.Process]) -> list[psutil.Process]:
    return [member for member in family if member.is_running() and member.status() != psutil.STATUS_ZOMBIE]


@pytest.mark.parametrize("command, stop, exit_code", [
    ("run", signal.SIGTERM, 143),
    ("run", signal.SIGHUP, 129),
    ("compare", signal.SIGTERM, 143),
], ids=["run-SIGTERM", "run-SIGHUP", "compare-SIGTERM"])
def test_a_stop_signal_ends_every_process_keeps_the_logs_and_marks_the_run_interrupted(tmp_path, command, stop,
                                                                                       exit_code):
    out = tmp_path / "runs"
    extra = ["--stages", "1", "--format", "json"] if command == "compare" else ["--format", "json"]
    cli = start_with_sleepy_training(tmp_path, command, *WORKLOAD, "--out", str(out), "--name", "stop", *extra)
    family = wait_for_first_step(out, cli)
    stopped_at = time.monotonic()
    cli.send_signal(stop)
    stdout, stderr = cli.communicate(timeout=60)
    assert cli.returncode == exit_code, stderr
    assert time.monotonic() - stopped_at < 60, "workers sleeping 120 s were stopped"
    assert not still_running(family), "no orphans"
    assert "Traceback" not in stderr and f"interrupted by {stop.name}" in stderr, stderr
    run_dir = out / "stop" / ("cells/w2-s1-nano" if command == "compare" else "")
    summary = json.loads((run_dir / "summary.json").read_text())
    assert (summary["status"], summary["interrupted_by"], summary["steps"]) == ("interrupted", stop.name, 1)
    assert (run_dir / "logs" / "rank1.stdout.log").is_file() and (run_dir / "logs" / "rank0.stdout.log").is_file()
    if command == "compare":
        comparison = json.loads((out / "stop" / "compare.json").read_text())
        assert comparison["interrupted"] is True and json.loads(stdout) == comparison
        assert comparison["verdict"]["exit_code"] == exit_code and comparison["verdict"]["interrupted_by"] == stop.name
        assert [row["impl"] for row in comparison["rows"]] == ["nano"], "official's cell never started"


def sigint_as_in_a_terminal() -> None:
    """A shell starts background jobs (a test run with `&`) with SIGINT ignored, and a child
    inherits that; a command started in a terminal has it at its default."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def start_paused_at(moment: str, *arguments: str) -> subprocess.Popen:
    """The command, started as from a terminal and paused at the named moment (zero_lab.launch.moments):
    returned once it says it is there, however fast or slow this machine is."""
    cli = subprocess.Popen([ZERO_LAB, *arguments], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           env={**os.environ, moments.PAUSE_VARIABLE: moment}, preexec_fn=sigint_as_in_a_terminal)
    hang_guard = threading.Timer(300, cli.kill)  # a bound against a hang (the loop then meets the end), not a speed test
    hang_guard.start()
    try:
        for line in cli.stderr:  # the pause line is the last the paused command prints, so nothing is read past it
            if line.strip() == f"[paused at {moment}]":
                return cli
    finally:
        hang_guard.cancel()
    cli.wait()
    pytest.fail(f"the command exited {cli.returncode} without reaching {moment}: {cli.stdout.read()}")


def interrupted(cli: subprocess.Popen) -> tuple[str, str]:
    """Ctrl-C the paused command; (stdout, the stderr after the pause) once it has exited."""
    cli.send_signal(signal.SIGINT)
    cli.wait(timeout=120)
    return cli.stdout.read(), cli.stderr.read()


def processes_naming(path: Path) -> list[psutil.Process]:
    """Running processes whose command line names path (torchrun and the workers of a run under it)."""
    named = []
    for process in psutil.process_iter(["cmdline", "status"]):
        if process.info["status"] != psutil.STATUS_ZOMBIE and any(str(path) in part for part in
                                                                   process.info["cmdline"] or []):
            named.append(process)
    return named


BEFORE_ANY_LAUNCH = [(command, moment) for command in ("run", "compare")
                     for moment in ("cli-started", "directory-claimed", "launching")]


@pytest.mark.parametrize("command, moment", BEFORE_ANY_LAUNCH, ids=[f"{c}-{m}" for c, m in BEFORE_ANY_LAUNCH])
def test_ctrl_c_before_anything_launched_is_exit_130_and_leaves_nothing(tmp_path, command, moment):
    """At each moment of start-up before torchrun starts: exit 130, no traceback, and no directory
    left behind (an empty run directory helps no one, and `report runs/*` would meet it)."""
    out = tmp_path / "runs"
    cli = start_paused_at(moment, command, *WORKLOAD, "--stages" if command == "compare" else "--stage", "1",
                          "--out", str(out))
    _, stderr = interrupted(cli)
    assert cli.returncode == 130 and "Traceback" not in stderr and "KeyboardInterrupt" not in stderr, stderr
    assert not out.exists() or not any(out.iterdir()), f"nothing launched, nothing left: {list(out.rglob('*'))}"
    assert not processes_naming(tmp_path)


def test_ctrl_c_just_after_torchrun_started_stops_it_and_keeps_an_interrupted_run(tmp_path):
    """torchrun has started, no step has come: it is stopped, nothing is orphaned, and the run
    directory stays with its summary marked interrupted after 0 steps."""
    out = tmp_path / "runs"
    cli = start_paused_at("launched", "run", *WORKLOAD, "--out", str(out), "--name", "early")
    _, stderr = interrupted(cli)
    assert cli.returncode == 130 and "Traceback" not in stderr, stderr
    assert not processes_naming(tmp_path), "torchrun and any worker it started were stopped"
    summary = json.loads((out / "early" / "summary.json").read_text())
    assert (summary["status"], summary["interrupted_by"], summary["steps"]) == ("interrupted", "SIGINT", 0)
    assert "interrupted by SIGINT" in stderr


def wait_for_worker(torchrun_parent: subprocess.Popen, rank: int, timeout_s: float = 60) -> psutil.Process:
    """The worker process of rank, as soon as torchrun has started it."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert torchrun_parent.poll() is None, torchrun_parent.communicate()
        for process in psutil.Process(torchrun_parent.pid).children(recursive=True):
            try:
                if process.environ().get("RANK") == str(rank):
                    return process
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
        time.sleep(0.05)
    pytest.fail(f"no rank {rank} within {timeout_s} s")


def test_a_stopped_rank_is_named_and_the_run_ends_as_stalled_with_exit_3(tmp_path):
    """Rank 1 is stopped as soon as it starts, so no step ever comes however slow start-up is here:
    the stall fires --stall-timeout after the launch, and must find rank 1 stopped."""
    stall_timeout_s = 30
    cli = subprocess.Popen([ZERO_LAB, "run", *WORKLOAD, "--out", str(tmp_path), "--name", "stall",
                            "--stall-timeout", str(stall_timeout_s)],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    rank1 = wait_for_worker(cli, rank=1, timeout_s=180)
    rank1.suspend()  # SIGSTOP
    launched = (tmp_path / "stall" / "command.txt").stat().st_mtime  # written just before torchrun starts
    print(f"rank 1 stopped {time.time() - launched:.1f} s after the launch")
    family = psutil.Process(cli.pid).children(recursive=True)
    _, stderr = cli.communicate(timeout=stall_timeout_s + 60)
    assert cli.returncode == 3, stderr
    assert "Traceback" not in stderr and not still_running(family), "no orphans, not even the stopped rank"
    stalled = [line for line in stderr.splitlines() if "stalled:" in line]
    assert len(stalled) == 1 and f"no [opt_step] progress for {stall_timeout_s} s before step 1 of 3" in stalled[0]
    assert "1 (stopped)" in stalled[0] and str(tmp_path / "stall") in stalled[0], stalled[0]
    summary = json.loads((tmp_path / "stall" / "summary.json").read_text())
    assert summary["status"] == "stalled" and summary["error"] in stalled[0]
    assert (tmp_path / "stall" / "logs" / "rank1.stderr.log").is_file()
    assert flag(tmp_path / "stall" / "command.txt", "--dist-timeout") == str(stall_timeout_s + 60)


def flag(command_file: Path, name: str) -> str:
    words = command_file.read_text().split()
    return words[words.index(name) + 1]


def test_compare_stops_a_cell_that_stalls_and_goes_on_to_the_next(tmp_path):
    out = tmp_path / "runs"
    cli = start_with_sleepy_training(tmp_path, "compare", *WORKLOAD, "--stages", "1,2", "--impls", "nano",
                                     "--stall-timeout", "3", "--out", str(out), "--name", "c", "--format", "json")
    stdout, stderr = cli.communicate(timeout=180)
    assert cli.returncode == 3, stderr
    comparison = json.loads(stdout)
    assert [(row["stage"], row["status"]) for row in comparison["rows"]] == [(1, "stalled"), (2, "stalled")]
    assert comparison["verdict"]["exit_code"] == 3 and len(comparison["verdict"]["failed_runs"]) == 2
    assert sum("stalled: no [opt_step] progress for 3 s" in line for line in stderr.splitlines()) == 2, stderr
    for stage in (1, 2):  # the stall may come before torchrun has started a worker: no rank logs then
        assert json.loads((out / "c" / "cells" / f"w2-s{stage}-nano" / "summary.json").read_text())["status"] == "stalled"


# Rank 0 logs a step, then holds 300 MB (written, so resident) - more than the 256 MB the run is
# given with --device-memory 0.25 - and waits to be killed, as the kernel's out-of-memory killer would.
OVER_THE_LIMIT_TRAIN = """
import os, time
if os.environ["RANK"] == "0":
    print("[zero] world_size=2", flush=True)
    print("[opt_step 1] loss=5.0 alloc_max_mb=1.0", flush=True)
    held = b"x" * (300 * 2**20)
time.sleep(120)
"""


def wait_for_sampled_rss(memory_csv_parent: Path, rank: int, at_least_mb: float, command: subprocess.Popen,
                         timeout_s: float = 180) -> None:
    """Until the memory watch has written a sample (memory.csv) of rank holding at_least_mb."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert command.poll() is None, command.communicate()
        for path in memory_csv_parent.rglob("memory.csv"):
            for row in path.read_text().splitlines()[1:]:
                fields = row.split(",")
                if len(fields) == 6 and fields[1] == str(rank) and float(fields[2]) >= at_least_mb:
                    return
        time.sleep(0.1)
    command.kill()
    pytest.fail(f"the memory watch never saw rank {rank} hold {at_least_mb} MB")


def test_a_rank_killed_while_over_the_memory_limit_is_reported_out_of_memory_with_its_figures(tmp_path):
    """The run exceeds its stated limit (--device-memory 0.25: 256 MB, rank 0 holds 300 MB); once the
    memory watch has seen it, the test SIGKILLs rank 0 as the kernel would. compare names
    out-of-memory with the figures on stderr, in compare.json, summary.json and the report, and
    keeps the logs and memory.csv. Nothing here asks the machine for more than 300 MB."""
    out, report = tmp_path / "runs", tmp_path / "report.md"
    script = tmp_path / "over_the_limit_train.py"
    script.write_text(OVER_THE_LIMIT_TRAIN)
    cli = subprocess.Popen([sys.executable, "-c", WITH_SCRIPT, str(script), "compare", *WORKLOAD, "--stages", "1",
                            "--impls", "nano", "--device-memory", "0.25", "--out", str(out), "--name", "oom",
                            "--report", str(report), "--format", "json",
                            "--force"],  # the preflight refuses: tiny's ranks are predicted to hold more than 256 MB
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for_sampled_rss(out, rank=0, at_least_mb=300, command=cli)
    wait_for_worker(cli, rank=0).kill()  # SIGKILL, as the out-of-memory killer sends it
    stdout, stderr = cli.communicate(timeout=120)
    assert cli.returncode == 3, stderr
    assert "Traceback" not in stderr
    said = [line for line in stderr.splitlines() if "out of memory" in line]
    assert len(said) == 1, stderr
    found = re.search(r"world_size=2 stage=1 impl=nano: killed, most likely out of memory: rank 0 held (\d+) MB "
                      r"resident, 0 MB of 256 MB was free \(--device-memory\); logs in ", said[0])
    assert found and int(found.group(1)) >= 300, said[0]
    comparison = json.loads(stdout)
    row = comparison["rows"][0]
    assert (row["status"], row["failure"], row["failed_rank"], row["rank_exit_code"]) == (
        "failed", "out_of_memory", 0, -9)
    assert row["rss_max_mb"] >= 300 and row["error"] in said[0] and row["steps"] == 1
    assert comparison["verdict"]["failed_runs"] == ["world_size=2 stage=1 impl=nano: failed (out of memory)"]
    run_dir = out / "oom" / "cells" / "w2-s1-nano"
    assert json.loads((run_dir / "summary.json").read_text())["failure"] == "out_of_memory"
    assert (run_dir / "logs" / "rank0.stdout.log").is_file() and (run_dir / "memory.csv").is_file()
    text = report.read_text()
    assert "stage 1, nano: failed (out of memory)" in text and row["error"] in text
    # `zero-lab doctor` (which compare points at) reads it from the run directory: an error, with the figures
    from zero_lab.analysis.diagnosis import diagnose

    assert f"zero-lab doctor {out / 'oom'}" in stderr
    [finding] = diagnose([run_dir])
    assert (finding.code, finding.severity, finding.evidence[0]) == ("out-of-memory", "error", row["error"])
    assert finding.figures["rss_max_mb"] == row["rss_max_mb"]


REFUSED_TRAIN = """
import os, sys, time
from pathlib import Path
said = Path({said!r})
if os.environ["RANK"] == "0":  # its line comes first, but rank 1 is the one that exits
    print("out of memory: rank 0 in forward: tried to allocate 1.0 GB; allocated 1.0 MB, resident 9 MB",
          file=sys.stderr, flush=True)
    said.touch()
    time.sleep(120)
while not said.exists():
    time.sleep(0.05)
print("out of memory: rank 1 in backward: tried to allocate 2.0 GB; allocated 74.1 GB, reserved 76.3 GB of 79.2 GB; "
      "peak live 75.0 GB this step", file=sys.stderr, flush=True)
sys.exit(4)
"""


def test_the_harness_out_of_memory_line_and_exit_4_are_the_runs_failure(tmp_path):
    """A rank whose allocation was refused (the harness's `out of memory:` line, exit code 4): the
    failed rank's own line is the run's error and the failure is out_of_memory, without any memory
    pressure here."""
    script = tmp_path / "refused_train.py"
    script.write_text(REFUSED_TRAIN.format(said=str(tmp_path / "rank0-said")))
    cli = subprocess.Popen([sys.executable, "-c", WITH_SCRIPT, str(script), "run", *WORKLOAD, "--out", str(tmp_path),
                            "--name", "refused", "--format", "json"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    stdout, stderr = cli.communicate(timeout=180)
    assert cli.returncode == 3, stderr
    summary = json.loads(stdout)
    assert (summary["failure"], summary["failed_rank"], summary["rank_exit_code"]) == ("out_of_memory", 1, 4)
    assert summary["error"].startswith("out of memory: rank 1 in backward: tried to allocate 2.0 GB")
    assert f"impl=nano: {summary['error']}; logs in" in stderr


WITH_SCRIPT_AND_CGROUP = ("import sys; from pathlib import Path; from zero_lab.launch import memory_watch, torchrun; "
                          "torchrun.TRAIN_SCRIPT = Path(sys.argv.pop(1)); memory_watch.CGROUP_ROOT = Path(sys.argv.pop(1)); "
                          "from zero_lab.cli.entry import main; main()")
CGROUP_LIMIT = 300 * 2**20
# Rank 0 joins the cgroup, logs a step, waits for the test's go (once the memory watch has sampled
# it), then allocates 20 MB at a time until the kernel kills it.
CGROUP_TRAIN = """
import os, time
from pathlib import Path
if os.environ["RANK"] == "0":
    Path({procs!r}).write_text(str(os.getpid()))
    print("[zero] world_size=2", flush=True)
    print("[opt_step 1] loss=5.0 alloc_max_mb=1.0", flush=True)
    while not Path({go!r}).exists():
        time.sleep(0.05)
    held = []
    while True:
        held.append(b"x" * (20 * 2**20))
time.sleep(120)
"""


@pytest.fixture
def memory_cgroup(tmp_path):
    """(a cgroup limited to CGROUP_LIMIT, the directory the memory watch is to read it as): a child of
    this machine's cgroup v1 memory controller, or of the v2 hierarchy; skipped where none can be made."""
    name = f"zero-lab-test-{os.getpid()}"
    for parent, v1 in ((Path("/sys/fs/cgroup/memory"), True), (Path("/sys/fs/cgroup"), False)):
        cgroup = parent / name
        try:
            cgroup.mkdir()
        except OSError:
            continue
        limit = cgroup / ("memory.limit_in_bytes" if v1 else "memory.max")
        try:
            limit.write_text(str(CGROUP_LIMIT))
        except OSError:
            cgroup.rmdir()
            continue
        root = tmp_path / "cgroup-root"
        if v1:
            root.mkdir()
            (root / "memory").symlink_to(cgroup)
        else:
            root.symlink_to(cgroup)
        yield cgroup, root
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # empty once its last process has been reaped
            try:
                cgroup.rmdir()
                break
            except OSError:
                time.sleep(0.2)
        return
    pytest.skip("no memory cgroup can be created here (needs root and a writable cgroup memory controller)")


def test_a_rank_the_kernel_kills_in_a_memory_cgroup_is_reported_out_of_memory(tmp_path, memory_cgroup):
    """The real thing: rank 0 runs in a cgroup limited to 300 MB and allocates until the kernel's
    out-of-memory killer ends it; the cgroup's own count of kills names the cause. Only that one
    process is limited, so the machine never comes near its own limit."""
    cgroup, root = memory_cgroup
    out, go = tmp_path / "runs", tmp_path / "go"
    script = tmp_path / "cgroup_train.py"
    script.write_text(CGROUP_TRAIN.format(procs=str(cgroup / "cgroup.procs"), go=str(go)))
    cli = subprocess.Popen([sys.executable, "-c", WITH_SCRIPT_AND_CGROUP, str(script), str(root), "run", *WORKLOAD,
                            "--out", str(out), "--name", "kernel", "--format", "json",
                            "--force"],  # the preflight refuses: tiny's ranks are predicted to hold more than 300 MB
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for_sampled_rss(out, rank=0, at_least_mb=1, command=cli)
    wait_for_first_step(out, cli)
    go.touch()
    stdout, stderr = cli.communicate(timeout=180)
    assert cli.returncode == 3, stderr
    summary = json.loads(stdout)
    assert (summary["failure"], summary["failed_rank"], summary["rank_exit_code"]) == ("out_of_memory", 0, -9)
    assert re.fullmatch(r"killed, most likely out of memory: rank 0 held \d+ MB resident, \d+ MB of 300 MB was free "
                        r"\(the container's cgroup limit\); the container counted 1 out-of-memory kill\(s\)",
                        summary["error"]), summary["error"]
    assert f"impl=nano: {summary['error']}; logs in" in stderr
