"""End to end on CPU: the issue's `zero-lab compare` command, and a run that fails.

One compare invocation (tiny, 2 processes, stages 1 and 2, both impls, 5 steps: about 90 s on
2 cores) is shared by every assertion through a module-scoped fixture.
"""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from typer.testing import CliRunner

from zero_lab.launch import torchrun
from zero_lab.cli.app import app
from zero_lab.launch.torchrun_job import stop_process_tree

pytestmark = pytest.mark.slow  # launches torchrun: `make test-fast` leaves it out

ZERO_LAB = str(Path(sys.executable).with_name("zero-lab"))
COMPARE = [ZERO_LAB, "compare", "--gpus", "2", "--device", "cpu", "--model", "tiny", "--steps", "5",
           "--stages", "1,2", "--format", "json", "--peak-tflops", "1.5"]
TINY_FLOPS_PER_TOKEN = 5_713_152  # docs/throughput.md: tiny at the harness's 128 tokens


@pytest.fixture(scope="module")
def compare_result(tmp_path_factory):
    out = tmp_path_factory.mktemp("runs")
    report = out / "report.md"
    done = subprocess.run([*COMPARE, "--out", str(out), "--name", "e2e", "--report", str(report)],
                          capture_output=True, text=True, timeout=900)
    return done, out / "e2e", report


@pytest.mark.slow
@pytest.mark.official
def test_compare_prints_one_json_object_with_rows_deltas_and_verdict(compare_result):
    done, _, _ = compare_result
    assert done.returncode == 0, done.stderr[-3000:]
    payload = json.loads(done.stdout)  # nothing else on stdout
    cells = {(row["stage"], row["impl"]) for row in payload["rows"]}
    assert cells == {(1, "nano"), (1, "official"), (2, "nano"), (2, "official")}
    for row in payload["rows"]:
        assert row["status"] == "ok" and row["steps"] == 5 and row["world_size"] == 2
        for key in ("loss_last", "alloc_max_mb", "peak_alloc_max_mb", "reserved_max_mb", "peak_reserved_max_mb",
                    "step_ms", "comm_mb", "comm_wire_mb"):
            assert isinstance(row[key], float), key
        # throughput as torchtitan reports it, against the given peak (a CPU is in no table)
        assert row["flops_per_token"] == TINY_FLOPS_PER_TOKEN
        assert row["tokens_per_s_per_device"] == pytest.approx(row["tokens_per_s"] / 2)
        assert row["tflops"] == pytest.approx(row["tokens_per_s_per_device"] * TINY_FLOPS_PER_TOKEN / 1e12)
        assert (row["peak_tflops"], row["peak_tflops_source"]) == (1.5, "--peak-tflops")
        assert row["mfu_pct"] == pytest.approx(100 * row["tflops"] / 1.5) and row["mfu_pct"] > 0
        # a rank's resident memory, predicted (tensors, what the heap keeps of the freed ones, and what the
        # process held beside them once its engine was built on this machine) against its high-water mark:
        # the 10% (bench/peak_vs_predicted.py: every stage and impl, tiny and small)
        assert 200 < row["rss_beside_tensors_mb"] < 1000, row["rss_beside_tensors_mb"]
        # official's leaves out the part of its staging buffer this small model never writes
        assert row["predicted_resident_mb"] > row["rss_beside_tensors_mb"] + (row["predicted_peak_mb"]
                                                                              if row["impl"] == "nano" else 0)
        assert abs(row["resident_error_pct"]) < 10, (
            f"{row['impl']} stage {row['stage']}: predicted {row['predicted_resident_mb']:.1f} MB resident (of it "
            f"{row['rss_beside_tensors_mb']:.1f} beside the tensors after initialize), measured "
            f"{row['peak_reserved_max_mb']:.1f} MB")
    assert [(d["stage"], d["impl"], d["baseline"]) for d in payload["deltas"]] == [
        (1, "nano", "official"), (2, "nano", "official")]
    for delta in payload["deltas"]:
        assert delta["loss_parity"] is True and delta["max_step_loss_delta"] <= 1e-4
        assert "alloc_max_mb_delta_pct" in delta and delta["step_time_ratio"] > 0
        # ZeRO's argument: a reduce-scatter and an all-gather against an all-reduce and an all-gather
        assert delta["comm_wire_ratio"] == pytest.approx(2 / 3, rel=0.01), delta
    assert payload["verdict"]["ok"] is True and payload["verdict"]["loss_parity"] is True


@pytest.mark.slow
@pytest.mark.official
def test_compare_keeps_every_run_directory_and_writes_the_report(compare_result):
    _, compare_dir, report = compare_result
    assert json.loads((compare_dir / "compare.json").read_text())["verdict"]["exit_code"] == 0
    run = compare_dir / "cells" / "w2-s2-official"
    for name in ("command.txt", "config.json", "config.official.json", "console.log", "metrics.csv",
                 "summary.json", "env.json", "logs/rank0.stdout.log", "logs/rank1.stderr.log"):
        assert (run / name).is_file(), name
    assert len((run / "metrics.csv").read_text().splitlines()) == 6
    text = report.read_text()
    assert "## world size 2, stage 2: nano vs official" in text and "**Verdict: PASS**" in text
    assert "## Throughput" in text and "MFU below 10%" in text  # tiny on 2 cores: overhead, and said so
    assert (report.parent / "report-loss.png").is_file() and (report.parent / "report-memory.png").is_file()


def failing_script(tmp_path: Path) -> Path:
    """A stand-in training script: rank 0 logs one step; then, for official only, rank 1 fails.
    Rank 1 waits for rank 0's step to be logged (a file rank 0 writes after it), so the step is
    there however the two ranks' start-ups interleave."""
    logged = tmp_path / "rank0-logged-step-1"
    script = tmp_path / "failing_train.py"
    script.write_text(f"""
import os, sys, time
from pathlib import Path
rank = int(os.environ["RANK"])
logged = Path({str(logged)!r})
if rank == 0:
    print("[zero] world_size=2", flush=True)
    print("[opt_step 1] loss=5.0 alloc_max_mb=1.0", flush=True)
    logged.touch()
while not logged.exists():
    time.sleep(0.05)
if "official" not in sys.argv:
    sys.exit(0)
if rank == 1:
    print("RuntimeError: injected failure on rank 1", file=sys.stderr, flush=True)
    sys.exit(7)
time.sleep(120)
""")
    return script


def test_a_failing_run_exits_3_keeps_its_logs_and_partial_results(tmp_path, monkeypatch):
    monkeypatch.setattr(torchrun, "TRAIN_SCRIPT", failing_script(tmp_path))
    result = CliRunner().invoke(app, ["run", "--impl", "official", "--gpus", "2", "--device", "cpu", "--steps", "3",
                                      "--out", str(tmp_path / "runs"), "--name", "boom", "--format", "json"])
    assert result.exit_code == 3, result.output
    summary = json.loads(result.stdout)
    assert summary["status"] == "failed" and summary["failed_rank"] == 1 and summary["rank_exit_code"] == 7
    assert summary["steps"] == 1, "the steps logged before the failure are kept"
    assert "injected failure on rank 1" in summary["log_tail"]
    assert "injected failure" in (tmp_path / "runs" / "boom" / "logs" / "rank1.stderr.log").read_text()
    assert "rank 1 exited with 7" in result.stderr


def test_bad_input_only_rank_1_reports_is_its_one_line_and_exit_2(tmp_path, monkeypatch):
    script = tmp_path / "rank1_refuses.py"
    script.write_text('import os, sys, time\nif os.environ["RANK"] == "1":\n'
                      '    print("error: injected bad input. Fix it", file=sys.stderr, flush=True)\n'
                      '    sys.exit(2)\ntime.sleep(30)\n')
    monkeypatch.setattr(torchrun, "TRAIN_SCRIPT", script)
    result = CliRunner().invoke(app, ["run", "--gpus", "2", "--device", "cpu", "--model", "tiny", "--steps", "1",
                                      "--out", str(tmp_path / "runs")])
    assert result.exit_code == 2, result.output
    assert result.stderr.strip().splitlines()[-1] == "error: injected bad input. Fix it"


def test_a_failed_cell_does_not_stop_the_others_and_compare_exits_3(tmp_path, monkeypatch):
    monkeypatch.setattr(torchrun, "TRAIN_SCRIPT", failing_script(tmp_path))  # official fails on rank 1, nano finishes
    result = CliRunner().invoke(app, ["compare", "--gpus", "2", "--device", "cpu", "--model", "tiny", "--steps", "1",
                                      "--stages", "1,2", "--out", str(tmp_path), "--name", "c", "--format", "json"])
    assert result.exit_code == 3, result.output
    payload = json.loads(result.stdout)
    assert [(r["stage"], r["impl"], r["status"]) for r in payload["rows"]] == [
        (1, "nano", "ok"), (1, "official", "failed"), (2, "nano", "ok"), (2, "official", "failed")]
    assert payload["verdict"]["exit_code"] == 3 and len(payload["verdict"]["failed_runs"]) == 2


def test_stopping_a_run_ends_torchrun_and_every_worker_within_seconds(tmp_path):
    sleeper = tmp_path / "sleep.py"
    sleeper.write_text("import time\ntime.sleep(120)\n")
    process = subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", *torchrun.single_node_rendezvous(0),
         str(sleeper)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True, env={**os.environ})
    deadline = time.monotonic() + 300  # a bound against a hang, not a speed test: start-up waits for its moment
    while len(psutil.Process(process.pid).children(recursive=True)) < 2 and time.monotonic() < deadline:
        time.sleep(0.2)
    family = psutil.Process(process.pid).children(recursive=True)
    assert len(family) >= 2
    started = time.monotonic()
    stop_process_tree(process)
    assert time.monotonic() - started < 60, "workers sleeping 120 s were stopped"
    assert not [member for member in family if member.is_running() and member.status() != psutil.STATUS_ZOMBIE]
    assert process.returncode is not None


def test_ctrl_c_marks_the_run_interrupted_keeps_its_results_and_exits_130(tmp_path, monkeypatch):
    from zero_lab.launch import torchrun_job

    script = tmp_path / "slow_train.py"
    script.write_text('import os, time\nif os.environ["RANK"] == "0":\n'
                      '    print("[opt_step 1] loss=5.0 alloc_max_mb=1.0", flush=True)\ntime.sleep(120)\n')
    monkeypatch.setattr(torchrun, "TRAIN_SCRIPT", script)
    real_stream = torchrun_job.stream

    def stream_then_ctrl_c(process, console_log, progress, task, on_step):
        with open(console_log, "w") as sink:
            for line in process.stdout:
                sink.write(line)
                if "[opt_step 1]" in line:
                    interrupted_at.append(time.monotonic())
                    raise KeyboardInterrupt  # what Python raises on SIGINT in the main thread
        real_stream(process, console_log, progress, task, on_step)

    monkeypatch.setattr(torchrun_job, "stream", stream_then_ctrl_c)
    interrupted_at = []
    result = CliRunner().invoke(app, ["run", "--impl", "nano", "--gpus", "2", "--device", "cpu", "--out",
                                      str(tmp_path / "runs"), "--name", "stop", "--format", "json"])
    assert result.exit_code == 130, result.output
    assert time.monotonic() - interrupted_at[0] < 60, "workers sleeping 120 s were stopped"
    summary = json.loads((tmp_path / "runs" / "stop" / "summary.json").read_text())
    assert summary["status"] == "interrupted" and summary["steps"] == 1 and summary["interrupted_by"] == "SIGINT"
    assert (tmp_path / "runs" / "stop" / "logs" / "rank1.stdout.log").is_file()
    assert "interrupted by SIGINT" in result.stderr and "exit code" not in result.stderr


def test_repeat_alternates_the_impls_and_pools_each_ones_steps(tmp_path, monkeypatch):
    """`compare --repeat 2` with a stand-in training script (no model, four launches of two trivial
    ranks): the launches go nano, official, nano, official; each impl's steady steps are pooled."""
    order = tmp_path / "order.txt"
    script = tmp_path / "timed_train.py"
    script.write_text(f"""
import os, sys
impl = "official" if "official" in sys.argv else "nano"
if os.environ["RANK"] == "0":
    with open({str(order)!r}, "a") as handle:
        handle.write(impl + "\\n")
    print("[zero] world_size=2", flush=True)
    for step, ms in enumerate([900.0, 200.0, 202.0, 198.0, 201.0], 1):  # official 2x nano's
        print(f"[opt_step {{step}}] loss=5.0 alloc_max_mb=1.0 step_ms={{ms * (2 if impl == 'official' else 1)}}",
              flush=True)
""")
    monkeypatch.setattr(torchrun, "TRAIN_SCRIPT", script)
    result = CliRunner().invoke(app, ["compare", "--gpus", "2", "--device", "cpu", "--model", "tiny", "--steps", "5",
                                      "--stages", "1", "--repeat", "2", "--out", str(tmp_path), "--name", "r",
                                      "--format", "json"])
    assert result.exit_code == 0, result.output
    assert order.read_text().split() == ["nano", "official", "nano", "official"]
    assert sorted(path.name for path in (tmp_path / "r" / "cells").iterdir()) == [
        "w2-s1-nano", "w2-s1-nano-run2", "w2-s1-official", "w2-s1-official-run2"]
    payload = json.loads(result.stdout)
    assert [(row["impl"], row["repeat"]) for row in payload["rows"]] == [
        ("nano", 1), ("nano", 2), ("official", 1), ("official", 2)]
    timed = {entry["impl"]: entry for entry in payload["step_times"]}
    assert (timed["nano"]["runs"], timed["nano"]["steps"], timed["nano"]["start_up_steps"]) == (2, 8, [1, 1])
    (delta,) = payload["deltas"]
    assert delta["step_time_ratio"] == pytest.approx(0.5) and delta["step_time_verdict"] == "faster"
    assert delta["step_time_ratio_low"] <= 0.5 <= delta["step_time_ratio_high"] < 1.0
