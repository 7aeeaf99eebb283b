"""Faults as users meet them, against the real `zero-lab` process: a stop signal from `timeout`, a
cancelled CI job or a closed terminal, and Ctrl-C while the command is still starting.

Each test starts the command in a process of its own. The signal tests run it with a stand-in
training script (rank 0 logs one step, then every rank sleeps), so they need torchrun but no model;
the CLI, torchrun and the process groups are the real ones.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

pytestmark = pytest.mark.slow

ZERO_LAB = str(Path(sys.executable).with_name("zero-lab"))
# The real entry point, with harness/train.py swapped for the script given as the first argument.
WITH_SCRIPT = ("import sys; from pathlib import Path; from zero_lab.analysis import launch; "
               "launch.TRAIN_SCRIPT = Path(sys.argv.pop(1)); from zero_lab.cli.entry import main; main()")
SLEEPY_TRAIN = """
import os, time
if os.environ["RANK"] == "0":
    print("[zero] world_size=2", flush=True)
    print("[opt_step 1] loss=5.0 alloc_max_mb=1.0", flush=True)
time.sleep(120)
"""
WORKLOAD = ["--gpus", "2", "--device", "cpu", "--model", "tiny", "--steps", "3"]


@pytest.fixture(autouse=True)
def leftovers_killed(tmp_path):
    """A failing test may leave the command, torchrun or a worker running: each names tmp_path."""
    yield
    for process in psutil.process_iter(["cmdline"]):
        if any(str(tmp_path) in part for part in process.info["cmdline"] or []):
            process.kill()


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
    assert time.monotonic() - stopped_at < 30, "workers sleeping 120 s were stopped"
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


def test_ctrl_c_while_the_command_starts_is_exit_130_without_a_traceback(tmp_path):
    cli = subprocess.Popen([ZERO_LAB, "run", *WORKLOAD, "--out", str(tmp_path / "runs")],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(1.0)  # importing the CLI alone takes seconds (torch)
    cli.send_signal(signal.SIGINT)
    stdout, stderr = cli.communicate(timeout=60)
    assert cli.returncode == 130 and "Traceback" not in stderr and "KeyboardInterrupt" not in stderr, stderr
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir()), "nothing launched, nothing left"
