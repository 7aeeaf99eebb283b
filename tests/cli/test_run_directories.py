"""Every run and comparison gets a directory of its own: created exclusively, never shared with a
command started in the same second, never an existing one, and an unwritable --out is bad input.

One test starts two real `zero-lab run` processes together (tiny, 2 processes, 2 steps: about 20 s
on 2 cores); the others need no training.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from zero_lab.analysis.runs import rundir
from zero_lab.launch import torchrun
from zero_lab.launch import torchrun_job
from zero_lab.cli.app import app

runner = CliRunner()
ZERO_LAB = str(Path(sys.executable).with_name("zero-lab"))
QUICK_SCRIPT = """
import os
if os.environ["RANK"] == "0":
    print("[opt_step 1] loss=5.0 alloc_max_mb=1.0", flush=True)
"""


def no_launch(*args, **kwargs):
    raise AssertionError("bad input launched torchrun")


def test_claim_creates_a_new_directory_or_numbers_the_next_one(tmp_path):
    first = rundir.claim(tmp_path / "runs", "20260101-120000-w2-s2-nano", numbered=True)
    second = rundir.claim(tmp_path / "runs", "20260101-120000-w2-s2-nano", numbered=True)
    assert (first.name, second.name) == ("20260101-120000-w2-s2-nano", "20260101-120000-w2-s2-nano-2")
    with pytest.raises(FileExistsError):
        rundir.claim(tmp_path / "runs", "20260101-120000-w2-s2-nano")


def test_runs_started_in_the_same_second_keep_their_own_logs(tmp_path, monkeypatch):
    script = tmp_path / "quick_train.py"
    script.write_text(QUICK_SCRIPT)
    monkeypatch.setattr(torchrun, "TRAIN_SCRIPT", script)
    monkeypatch.setattr(rundir, "timestamp", lambda now=None: "20260101-120000")
    for _ in range(2):
        result = runner.invoke(app, ["run", "--gpus", "1", "--device", "cpu", "--model", "tiny", "--steps", "1",
                                     "--out", str(tmp_path / "runs"), "--format", "json"])
        assert result.exit_code == 0, result.output
    names = sorted(path.name for path in (tmp_path / "runs").iterdir())
    assert names == ["20260101-120000-w1-s2-nano", "20260101-120000-w1-s2-nano-2"]
    for name in names:
        summary = json.loads((tmp_path / "runs" / name / "summary.json").read_text())
        assert summary["run_dir"] == str(tmp_path / "runs" / name) and summary["steps"] == 1
        assert (tmp_path / "runs" / name / "logs" / "rank0.stdout.log").is_file()


@pytest.mark.slow
def test_two_runs_started_together_never_share_a_directory(tmp_path):
    command = [ZERO_LAB, "run", "--impl", "nano", "--gpus", "2", "--device", "cpu", "--model", "tiny", "--steps", "2",
               "--out", str(tmp_path), "--name", "same", "--format", "json"]
    both = [subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    done = [(process.wait(timeout=300), *process.communicate()) for process in both]
    assert sorted(code for code, _, _ in done) == [0, 2], done
    refused = next(err for code, _, err in done if code == 2)
    assert refused == f"error: {tmp_path / 'same'} already exists. pick another --name or --out (zero-lab never " \
                      "writes into an existing directory)\n"
    summary = json.loads((tmp_path / "same" / "summary.json").read_text())
    assert summary["status"] == "ok" and summary["steps"] == 2
    assert sorted(path.name for path in (tmp_path / "same" / "logs").iterdir()) == [
        "collectives-rank0.bin", "collectives-rank1.bin",  # each rank's flight record (docs/doctor.md)
        "parameter-norms.jsonl",  # rank 0's parameter norms after each step (docs/cli.md, "First divergence")
        "rank0.stderr.log", "rank0.stdout.log", "rank1.stderr.log", "rank1.stdout.log"]


@pytest.mark.parametrize("command", ["run", "compare"])
def test_an_existing_directory_is_refused_even_without_results(tmp_path, monkeypatch, command):
    (tmp_path / "half" / "cells" / "w2-s1-nano").mkdir(parents=True)  # a comparison cut short
    (tmp_path / "half" / "cells" / "w2-s1-nano" / "console.log").write_text("kept\n")
    monkeypatch.setattr(torchrun_job.subprocess, "Popen", no_launch)
    result = runner.invoke(app, [command, "--device", "cpu", "--model", "tiny", "--out", str(tmp_path), "--name", "half"])
    assert result.exit_code == 2 and result.stderr.startswith(f"error: {tmp_path / 'half'} already exists"), result.output
    assert (tmp_path / "half" / "cells" / "w2-s1-nano" / "console.log").read_text() == "kept\n"


def unwritable_out(tmp_path: Path, kind: str) -> Path:
    if kind == "a file in the path":
        (tmp_path / "file").write_text("")
        return tmp_path / "file" / "runs"
    if kind == "sysfs, where even root may not create directories":
        if not Path("/sys/kernel").is_dir():
            pytest.skip("no sysfs here")
        return Path("/sys/zero-lab-runs")
    if os.geteuid() == 0:
        pytest.skip("root writes into read-only directories")
    (tmp_path / "read-only").mkdir(mode=0o555)
    return tmp_path / "read-only" / "runs"


@pytest.mark.parametrize("kind", ["a file in the path", "a read-only directory",
                                  "sysfs, where even root may not create directories"])
@pytest.mark.parametrize("command", ["run", "compare"])
def test_an_unwritable_out_is_one_line_and_exit_2_before_anything_starts(tmp_path, monkeypatch, command, kind):
    out = unwritable_out(tmp_path, kind)
    monkeypatch.setattr(torchrun_job.subprocess, "Popen", no_launch)
    result = runner.invoke(app, [command, "--device", "cpu", "--model", "tiny", "--out", str(out)])
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith(f"error: cannot create a directory in --out {out}") and result.stderr.count("\n") == 1
    assert "Traceback" not in result.output


def test_bad_input_found_after_the_directory_is_claimed_leaves_nothing(tmp_path):
    config = tmp_path / "bad.json"
    config.write_text(json.dumps({"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"no_such_key": 1}}))
    result = runner.invoke(app, ["run", "--device", "cpu", "--model", "tiny", "--config", str(config),
                                 "--out", str(tmp_path / "runs"), "--name", "bad"])
    assert result.exit_code == 2 and "no_such_key" in result.stderr, result.output
    assert not (tmp_path / "runs" / "bad").exists()
