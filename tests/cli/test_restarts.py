"""A lost rank under `--max-restarts`: torchrun restarts the workers, they resume from the newest complete
checkpoint, and the run ends where a run that never failed ends (docs/restarts.md).

Per impl, two real `zero-lab run` launches of the tiny model (W=2, 6 steps, a checkpoint every 2): one that
never fails, the reference, and one whose ranks are killed twice with SIGKILL from this test, at named
moments (`zero_lab.workload.faults.rank_pause`, no sleeps): rank 1 inside step 4's save (its files written, `latest`
not yet moved), then, in the restarted attempt, rank 0 after step 5. The restarts resume from step 2 and then
from step 4. nano's restarted run is a cell of `zero-lab compare`, official's and FSDP2's a `zero-lab run`. A stand-in
training script shows the restarts running out.
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
import torch
import torch.distributed

from zero_lab.analysis.diagnosis import diagnose
from zero_lab.analysis.runs.logparse import parse_file
from zero_lab.analysis.report.markdown import run_table
from zero_lab.analysis.compare.metrics import DEFAULT_LOSS_TOL
from zero_lab.nano.checkpoint import files
from zero_lab.workload.faults.rank_pause import PAUSE_VARIABLE
from tests.leftovers import leftovers_killed  # noqa: F401 (autouse: each test kills what it leaves)
from tests.pauses import wait_for_pause

pytestmark = pytest.mark.slow

ZERO_LAB = str(Path(sys.executable).with_name("zero-lab"))
WORKLOAD = ["--gpus", "2", "--device", "cpu", "--model", "tiny", "--steps", "6", "--format", "json"]
# The ranks killed, one a attempt: rank 1 inside step 4's save, then rank 0 after step 5.
KILLS = "1:save-4,0:step-5"


def start(out: Path, name: str, save_dir: Path | None, impl: str, *arguments: str,
          env: dict | None = None) -> subprocess.Popen:
    """`zero-lab run` into out/name with its checkpoints in save_dir; save_dir None: `zero-lab compare` of the
    one cell, whose checkpoints go to the cell's own directory."""
    if save_dir is None:
        command = ["compare", "--impls", impl, "--stages", "2", *WORKLOAD]
    else:
        command = ["run", "--impl", impl, "--stage", "2", *WORKLOAD, "--save-dir", str(save_dir)]
    return subprocess.Popen([ZERO_LAB, *command, "--save-every", "2", "--out", str(out), "--name", name, *arguments],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, **(env or {})})


def finish(cli: subprocess.Popen) -> dict:
    stdout, stderr = cli.communicate(timeout=600)
    assert cli.returncode == 0, stderr
    printed = json.loads(stdout)
    run_dir = printed["rows"][0]["run_dir"] if "rows" in printed else printed["run_dir"]
    return json.loads((Path(run_dir) / "summary.json").read_text())


def tensors_of(state: object, prefix: str = "") -> dict[str, torch.Tensor]:
    """Every tensor in a checkpoint file's nested dicts and lists, by its path of keys."""
    if isinstance(state, torch.Tensor):
        return {prefix: state}
    items = state.items() if isinstance(state, dict) else enumerate(state) if isinstance(state, (list, tuple)) else []
    found = {}
    for key, value in items:
        found.update(tensors_of(value, f"{prefix}/{key}"))
    return found


def checkpoint_tensors(save_dir: Path, tag: str) -> dict[str, torch.Tensor]:
    """Every tensor of every file of one checkpoint (module, fp32 masters, Adam moments), by file and path;
    FSDP2's DCP checkpoint read whole by torch's own converter."""
    if (save_dir / tag / ".metadata").is_file():
        from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

        whole = save_dir.with_name(f"{save_dir.name}-{tag}.pt")
        dcp_to_torch_save(save_dir / tag, whole)
        return tensors_of(torch.load(whole, weights_only=False))
    found = {}
    for path in sorted((save_dir / tag).glob("*.pt")):
        found.update(tensors_of(files.read_file(str(path)), path.name))
    return found


@pytest.fixture(scope="module")
def nano_reference(tmp_path_factory) -> tuple[dict, Path]:
    """nano's run that never fails (W=2): its summary and its checkpoints."""
    root = tmp_path_factory.mktemp("reference-nano")
    return finish(start(root / "runs", "reference", root / "ckpt", "nano")), root / "ckpt"


# nano's restarted run is a `compare` cell, official's and FSDP2's a `run`: both commands, one launch each.
@pytest.fixture(scope="module", params=["nano", pytest.param("official", marks=pytest.mark.official), "fsdp2"])
def runs(request, tmp_path_factory):
    """(reference summary, its checkpoints, restarted summary, its checkpoints, what the test saw at each pause,
    the impl)."""
    impl = request.param
    root = tmp_path_factory.mktemp(f"restarts-{impl}")
    out = root / "runs"
    if impl == "nano":
        reference_summary, reference_dir = request.getfixturevalue("nano_reference")
    else:
        reference_summary, reference_dir = finish(start(out, "reference", root / "reference-ckpt", impl)), \
            root / "reference-ckpt"
    by_compare = impl == "nano"
    run_dir = out / "restarted" / "cells" / f"w2-s2-{impl}" if by_compare else out / "restarted"
    restarted_dir = run_dir / "checkpoints" if by_compare else root / "restarted-ckpt"
    cli = start(out, "restarted", None if by_compare else restarted_dir, impl, "--max-restarts", "2",
                env={PAUSE_VARIABLE: KILLS})
    seen = []
    for count in range(2):
        paused = wait_for_pause(run_dir, cli, count)
        # what a kill now would leave: the tags on disk and the one `latest` names
        paused["latest"] = (restarted_dir / files.LATEST).read_text()
        paused["tags"] = files.list_tags(str(restarted_dir))
        os.kill(int(paused["pid"]), signal.SIGKILL)
        seen.append(paused)
    return reference_summary, reference_dir, finish(cli), restarted_dir, seen, impl


def test_a_rank_killed_during_a_save_leaves_latest_at_the_previous_complete_checkpoint(runs):
    _, _, _, _, seen, _ = runs
    assert [(pause["rank"], pause["moment"]) for pause in seen] == [("1", "save-4"), ("0", "step-5")]
    assert seen[0]["latest"] == "global_step2", "step 4's files are written, but not every rank said so"
    assert seen[1]["latest"] == "global_step4", "the restarted attempt saved step 4 again, completely"


def test_the_restarted_run_ends_with_the_uninterrupted_runs_weights_bitwise(runs):
    _, reference_dir, summary, restarted_dir, _, impl = runs
    assert summary["status"] == "ok" and summary["steps"] == 6
    expected, found = checkpoint_tensors(reference_dir, "global_step6"), checkpoint_tensors(restarted_dir, "global_step6")
    assert sorted(found) == sorted(expected) and len(expected) > 10
    assert impl != "nano" or len(expected) == 63, "docs/restarts.md: the module, masters and moments of 2 ranks"
    unequal = [name for name in expected if not torch.equal(found[name], expected[name])]
    assert not unequal, f"{len(unequal)} tensors differ, first {unequal[0]}"


def test_every_step_and_every_repeated_step_reproduces_the_losses(runs):
    reference, _, summary, _, _, _ = runs
    assert summary["losses"] == reference["losses"] and len(reference["losses"]) == 6
    # steps 3-4 ran twice (the first restart resumed from step 2), step 5 twice (the second from step 4)
    assert summary["repeated_steps"] == [3, 4, 5]
    assert summary["repeated_loss_max_diff"] == 0.0
    rank0_lines = (Path(summary["run_dir"]) / "logs" / "rank0.stdout.log").read_text().splitlines()
    logged = [(int(step), int(attempt)) for step, attempt in
              (re.match(r"\[opt_step (\d+)\] .* attempt=(\d+)", line).groups() for line in rank0_lines
               if line.startswith("[opt_step"))]
    assert logged == [(1, 0), (2, 0), (3, 0), (4, 0), (3, 1), (4, 1), (5, 1), (5, 2), (6, 2)]


def test_the_summary_records_each_restart(runs):
    _, _, summary, _, _, _ = runs
    assert summary["restarts"] == 2
    events = [{key: event[key] for key in ("attempt", "rank", "signal", "exit_code", "after_step",
                                           "resumed_from_step")} for event in summary["restart_events"]]
    assert events == [
        {"attempt": 1, "rank": 1, "signal": "SIGKILL", "exit_code": -9, "after_step": 4, "resumed_from_step": 2},
        {"attempt": 2, "rank": 0, "signal": "SIGKILL", "exit_code": -9, "after_step": 5, "resumed_from_step": 4},
    ]


def test_the_doctor_and_the_table_tell_each_restart(runs):
    _, _, summary, _, _, _ = runs
    findings = {finding.code: finding for finding in diagnose([Path(summary["run_dir"])])}
    assert "restart-not-reproduced" not in findings
    assert findings["rank-restarted"].evidence == [
        "attempt 1: rank 1 was killed by SIGKILL after step 4; every rank restarted from the checkpoint of step 2",
        "attempt 2: rank 0 was killed by SIGKILL after step 5; every rank restarted from the checkpoint of step 4",
        "steps run twice: 3, 4, 5; the largest difference between a repeated step's losses: 0",
    ]
    headers, (row,) = run_table([summary])
    assert row[headers.index("status")] == "ok, 2 restarts"


ELASTIC = ["run", "--impl", "nano", "--gpus", "1", "--device", "cpu", "--model", "tiny", "--steps", "6", "--format",
           "json", "--nnodes", "1:2", "--rdzv-id", "restarts", "--max-restarts", "1", "--save-every", "2"]


def start_machine(out: Path, name: str, save_dir: Path, store_port: int, last_call_s: int,
                  env: dict | None = None) -> subprocess.Popen:
    """One machine of an elastic job (`--nnodes 1:2`, one rank each) on this one: a `zero-lab run` whose
    torchrun meets the other's in a rendezvous this test hosts (`is_host=false`), so it outlives either.
    `last_call_s`: how long a rendezvous this machine's arrival opens waits for the other machine."""
    conf = f"is_host=false,last_call_timeout={last_call_s},keep_alive_interval=1,keep_alive_max_attempt=2"
    return subprocess.Popen([ZERO_LAB, *ELASTIC, "--rdzv-endpoint", f"127.0.0.1:{store_port}", "--save-dir",
                             str(save_dir), "--out", str(out), "--name", name, "--", "--rdzv-conf", conf],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, **(env or {})})


def logged_steps(*run_dirs: Path) -> list[tuple[int, int, float]]:
    """(attempt, step, loss) of every `[opt_step]` line in the runs' rank-0 logs (on each machine, its local
    rank 0, which logs the steps while it is global rank 0), sorted."""
    found = set()
    for run_dir in run_dirs:
        for line in (run_dir / "logs" / "rank0.stdout.log").read_text().splitlines():
            matched = re.match(r"\[opt_step (\d+)\] loss=(\S+) .* attempt=(\d+)", line)
            if matched:
                found.add((int(matched[3]), int(matched[1]), float(matched[2])))
    return sorted(found)


def test_a_restart_with_fewer_ranks_keeps_the_global_batch_and_the_losses(nano_reference, tmp_path):
    """Two machines of one rank each; the whole of one is lost (its torchrun and its rank, SIGKILL) after step 3.
    The other restarts alone (W=1), resumes from step 2 resharded, and accumulates 2 micro-batches a step, so
    each step trains on the 8 samples it did at W=2."""
    reference, _ = nano_reference
    store = torch.distributed.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    out, save_dir = tmp_path / "runs", tmp_path / "ckpt"
    # The machine to lose joins first: its rendezvous then waits (up to 600 s, a bound against a hang) for the
    # other, which joins once the rendezvous state exists; alone after the loss, the other waits 2 s.
    lost = start_machine(out, "lost", save_dir, store.port, 600, env={PAUSE_VARIABLE: "*:step-3"})
    deadline = time.monotonic() + 300
    while not store.check(["torch.rendezvous.restarts"]):
        assert lost.poll() is None and time.monotonic() < deadline, lost.communicate()
        time.sleep(0.1)
    kept = start_machine(out, "kept", save_dir, store.port, 2)
    worker = psutil.Process(int(wait_for_pause(out / "lost", lost, 0)["pid"]))
    machine = [worker.parent(), worker]  # its torchrun agent and its rank
    for process in machine:
        process.kill()
    lost.communicate(timeout=120)
    assert lost.returncode == 3
    summary = finish(kept)
    assert (summary["status"], summary["restarts"], summary["world_size"]) == ("ok", 1, 1)
    assert summary["zero"]["gradient_accumulation_steps"] == 2
    steps = logged_steps(out / "lost", out / "kept")
    assert [(attempt, step) for attempt, step, _ in steps] == [(0, 1), (0, 2), (0, 3), (1, 3), (1, 4), (1, 5), (1, 6)]
    expected = {int(step): loss for step, loss in reference["losses"].items()}
    assert all(loss == expected[step] for attempt, step, loss in steps if attempt == 0), "W=2, as the reference"
    gap = max(abs(loss - expected[step]) for attempt, step, loss in steps if attempt == 1)
    assert gap <= 1e-6 < DEFAULT_LOSS_TOL["fp32"], gap  # docs/restarts.md
    loads = [row for row in parse_file(out / "kept" / "logs" / "rank0.stdout.log").checkpoints if row["action"] == "load"]
    assert [row["step"] for row in loads] == [2], "the W=1 attempt resumed from the W=2 checkpoint of step 2"


# A stand-in for the harness whose rank 1 fails on every attempt: no model, so the launch is cheap.
FAILING_TRAIN = """
import os, sys
print("[rank] global_rank=%s world_size=2 local_rank=%s" % (os.environ["RANK"], os.environ["LOCAL_RANK"]), flush=True)
if os.environ["RANK"] == "1":
    sys.exit(7)
"""
WITH_SCRIPT = ("import sys; from pathlib import Path; from zero_lab.launch import torchrun; "
               "torchrun.TRAIN_SCRIPT = Path(sys.argv.pop(1)); from zero_lab.cli.entry import main; main()")


def test_when_the_restarts_are_used_up_the_run_fails_with_every_attempts_logs(tmp_path):
    script = tmp_path / "failing_train.py"
    script.write_text(FAILING_TRAIN)
    cli = subprocess.run([sys.executable, "-c", WITH_SCRIPT, str(script), "run", "--gpus", "2", "--device", "cpu",
                          "--model", "tiny", "--steps", "2", "--max-restarts", "1", "--out", str(tmp_path),
                          "--name", "bounded", "--format", "json"], capture_output=True, text=True, timeout=300)
    assert cli.returncode == 3, cli.stderr
    summary = json.loads((tmp_path / "bounded" / "summary.json").read_text())
    assert (summary["status"], summary["failed_rank"], summary["rank_exit_code"]) == ("failed", 1, 7)
    assert summary["restarts"] == 1 and summary["restart_events"][0]["exit_code"] == 7
    rank1 = (tmp_path / "bounded" / "logs" / "rank1.stdout.log").read_text()
    assert rank1.count("[rank] global_rank=1") == 2, "both attempts' logs are kept"
