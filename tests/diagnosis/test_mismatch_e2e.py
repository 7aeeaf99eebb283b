"""A run that aborts because one rank runs a module the other skips, diagnosed from the ranks' flight
records: `zero-lab compare --script` launches examples/skipping_script.py under torchrun with
nano and with official DeepSpeed at stage 3 (2 ranks on CPU, nothing prefetched); at step 2 rank 1
alone gathers `vision`, rank 0 gathers `head`, and gloo aborts rank 1 (SIGABRT: no Python cleanup
runs). The launch is what is tested: the launcher asks each rank for a record in its run's logs/,
the record is on disk after the abort, compare says to run the doctor, and `zero-lab doctor`
names the first call where the ranks parted, on each rank.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.official]

REPO = Path(__file__).resolve().parents[2]
ZERO_LAB = str(Path(sys.executable).with_name("zero-lab"))
# Every module gathered, however small (no persistent parameters, no prefetch): lesson 10's config.
CONFIG = REPO / "docs" / "learn" / "configs" / "zero3-every-module-gathered.json"
# The gathers at the call where the ranks part: rank 0 the head (64 x 32 + 64 parameters), rank 1 the
# vision tower (32 x 32 + 32), each the whole unit in fp32.
HEAD_BYTES, VISION_BYTES = (64 * 32 + 64) * 4, (32 * 32 + 32) * 4


def compare_skipping(out: Path, name: str, *flags: str) -> subprocess.CompletedProcess:
    """`zero-lab compare --script` of the skipping script, nano and official at stage 3 on 2 CPU ranks, into out/name."""
    return subprocess.run(
        [ZERO_LAB, "compare", "--script", str(REPO / "examples" / "skipping_script.py"), "--impls",
         "nano,official", "--stages", "3", "--gpus", "2", "--device", "cpu", "--config", str(CONFIG), "--out", str(out),
         "--name", name, "--stall-timeout", "600", *flags, "--", "--steps", "3"],
        capture_output=True, text=True, timeout=1200, cwd=REPO)


@pytest.fixture(scope="module")
def aborted(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    out = tmp_path_factory.mktemp("mismatch")
    return out / "skip", compare_skipping(out, "skip")


def test_compare_reports_the_failed_runs_and_points_at_the_doctor(aborted):
    compare_dir, done = aborted
    assert done.returncode == 3, done.stderr[-4000:]
    assert f"doctor: 2 findings (collective-mismatch): zero-lab doctor {compare_dir}" in done.stderr
    for impl in ("nano", "official"):
        summary = json.loads((compare_dir / "cells" / f"w2-s3-{impl}" / "summary.json").read_text())
        assert summary["status"] == "failed" and summary["rank_exit_code"] == -6  # SIGABRT


def test_the_doctor_names_where_the_ranks_parted(aborted):
    compare_dir, _ = aborted
    done = subprocess.run([ZERO_LAB, "doctor", str(compare_dir), "--format", "json"], capture_output=True, text=True,
                          timeout=300, cwd=REPO)
    assert done.returncode == 1, done.stderr  # a finding of severity error
    findings = {Path(finding["runs"][0]).name: finding for finding in json.loads(done.stdout)["findings"]}
    assert set(findings) == {"w2-s3-nano", "w2-s3-official"}
    for finding in findings.values():
        assert (finding["code"], finding["severity"]) == ("collective-mismatch", "error")
        ranks = finding["figures"]["ranks"]
        assert [(rank["payload_bytes"], rank["dtype"], rank["step"], rank["call"]) for rank in ranks.values()] == [
            (HEAD_BYTES, "float32", 2, "forward"), (VISION_BYTES, "float32", 2, "forward")]
        assert any("Is there a distributed collective mismatch" in line for line in finding["evidence"])
    # docs/doctor.md shows these: nano's finding line for line (whether a call returned before the
    # abort is left out: it races the backend's thread), and the call where official parted
    doc = " ".join((REPO / "docs" / "doctor.md").read_text().split())
    text = subprocess.run([ZERO_LAB, "doctor", str(compare_dir / "cells" / "w2-s3-nano")], capture_output=True,
                          text=True, timeout=300, cwd=REPO).stdout
    shown = [line.split(";")[0].strip() for line in text.splitlines()[:6]]
    assert all(line in doc for line in shown), shown
    assert f"Official DeepSpeed parts at its call {findings['w2-s3-official']['figures']['call']}" in doc
    nano = findings["w2-s3-nano"]["figures"]["ranks"]
    assert (nano["0"]["label"], nano["1"]["label"]) == ("unit head", "unit vision")  # nano names its units
    assert "a module that some ranks ran and the others skipped" in findings["w2-s3-nano"]["cause"]


def test_a_rank_killed_from_outside_is_named_so_and_no_mismatch(tmp_path):
    """`zero-lab run` of nano at stage 2 (2 ranks, no restarts); rank 1 pauses after step 3 and the test
    SIGKILLs it, as the out-of-memory killer or a lost node would; rank 0 waits in step 4's first
    collective until gloo gives up. The doctor says rank-killed, not collective-mismatch."""
    import os
    import signal

    from tests.pauses import wait_for_pause
    from zero_lab.workload.faults.rank_pause import PAUSE_VARIABLE

    cli = subprocess.Popen([ZERO_LAB, "run", "--impl", "nano", "--stage", "2", "--gpus", "2", "--device", "cpu",
                            "--model", "tiny", "--steps", "6", "--out", str(tmp_path), "--name", "killed",
                            "--format", "json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           env={**os.environ, PAUSE_VARIABLE: "1:step-3"}, cwd=REPO)
    paused = wait_for_pause(tmp_path / "killed", cli, 0)
    assert paused["rank"] == "1"
    os.kill(int(paused["pid"]), signal.SIGKILL)
    _, stderr = cli.communicate(timeout=600)
    assert cli.returncode == 3, stderr[-3000:]
    done = subprocess.run([ZERO_LAB, "doctor", str(tmp_path / "killed"), "--format", "json"], capture_output=True,
                          text=True, timeout=300, cwd=REPO)
    codes = [finding["code"] for finding in json.loads(done.stdout)["findings"]]
    assert "rank-killed" in codes and "collective-mismatch" not in codes, codes
    (killed,) = [finding for finding in json.loads(done.stdout)["findings"] if finding["code"] == "rank-killed"]
    assert killed["figures"] == {"rank": 1, "signal": "SIGKILL"}, killed


def test_the_agent_killed_leaves_no_rank_running_and_is_named(tmp_path):
    """torchrun's agent SIGKILLed while rank 1 waits paused after step 2: its ranks, each in a session of its
    own, outlive it; the launcher stops them, and the doctor says the launch was killed from outside."""
    import os

    import psutil

    from tests.pauses import wait_for_pause
    from zero_lab.workload.faults.rank_pause import PAUSE_VARIABLE

    cli = subprocess.Popen([ZERO_LAB, "run", "--impl", "nano", "--stage", "2", "--gpus", "2", "--device", "cpu",
                            "--model", "tiny", "--steps", "4", "--out", str(tmp_path), "--name", "agent",
                            "--format", "json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           env={**os.environ, PAUSE_VARIABLE: "1:step-2"}, cwd=REPO)
    wait_for_pause(tmp_path / "agent", cli, 0)
    agent = next(child for child in psutil.Process(cli.pid).children(recursive=True)
                 if "torch.distributed.run" in " ".join(child.cmdline()))
    agent.kill()
    _, stderr = cli.communicate(timeout=600)
    assert cli.returncode == 3, stderr[-3000:]
    left = [process for process in psutil.process_iter(["cmdline"])
            if str(tmp_path / "agent") in " ".join(process.info["cmdline"] or [])]
    assert left == [], left
    done = subprocess.run([ZERO_LAB, "doctor", str(tmp_path / "agent"), "--format", "json"], capture_output=True,
                          text=True, timeout=300, cwd=REPO)
    [finding] = [finding for finding in json.loads(done.stdout)["findings"] if finding["severity"] == "error"]
    assert finding["code"] == "rank-killed" and "the launch" in finding["title"], finding
