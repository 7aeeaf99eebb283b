"""`zero-lab compare --script`: a user's Hugging Face Trainer script (examples/hf_trainer.py), run
under torchrun with nano and with official DeepSpeed, gives the built-in workload's tables, verdict
and compare.json, read from the log contract the engines printed. 2 processes on CPU, stage 2,
3 optimizer steps: about 3 minutes on 2 loaded cores; and examples/accelerate_loop.py the same way, 2 steps.
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from zero_lab.analysis.runs import traces
from zero_lab.analysis.runs.logparse import parse_file
from zero_lab.workload.log_contract.log_lines import MB

pytestmark = [pytest.mark.slow, pytest.mark.official]

REPO = Path(__file__).resolve().parents[2]
ZERO_LAB = str(Path(sys.executable).with_name("zero-lab"))


def test_compare_script_runs_the_trainer_on_both_impls_and_the_verdict_passes(tmp_path):
    report = tmp_path / "report.md"
    done = subprocess.run(
        [ZERO_LAB, "compare", "--script", str(REPO / "examples" / "hf_trainer.py"), "--gpus", "2", "--device", "cpu",
         "--stages", "2", "--out", str(tmp_path), "--name", "cmp", "--report", str(report), "--format", "json",
         "--stall-timeout", "600", "--", "--max-steps", "4"],
        capture_output=True, text=True, timeout=1200, cwd=REPO)
    assert done.returncode == 0, done.stderr[-4000:]
    comparison = json.loads((tmp_path / "cmp" / "compare.json").read_text())
    # 4 steps: the harness config's WarmupLR runs updates 1 and 2 at 0, so step 4's loss shows update 3
    assert comparison["verdict"]["ok"] and comparison["verdict"]["loss_parity"] is True
    assert comparison["verdict"]["updates_compared"] == 1
    assert comparison["script"]["arguments"] == ["--max-steps", "4"]
    rows = {row["impl"]: row for row in comparison["rows"]}
    assert set(rows) == {"nano", "official"}
    for row in rows.values():
        assert (row["status"], row["steps"], row["world_size"], row["stage"]) == ("ok", 4, 2, 2)
        assert row["alloc_max_mb"] > 0 and row["comm_mb"] > 0 and row["step_ms"] > 0
    assert rows["nano"]["optimizer"] == "PartitionedAdam" and rows["official"]["optimizer"] == "torch.optim.AdamW"
    [delta] = comparison["deltas"]
    assert delta["max_step_loss_delta"] <= 1e-6  # fp32, the same batches: the target

    # Each engine got the config zero-lab wrote for its cell, appended as DeepSpeed's own flag.
    for impl, name in (("nano", "config.json"), ("official", "config.official.json")):
        command = (tmp_path / "cmp" / "cells" / f"w2-s2-{impl}" / "command.txt").read_text()
        assert command.split()[-2:] == ["--deepspeed_config", str(tmp_path / "cmp" / "cells" / f"w2-s2-{impl}" / name)]
    assert "hf_trainer.py" in report.read_text().splitlines()[0]


def test_compare_script_runs_the_accelerate_loop_on_both_impls_and_the_verdict_passes(tmp_path):
    """examples/accelerate_loop.py (accelerate's DeepSpeedPlugin, the config's optimizer through
    DummyOptim) under `compare --script`: 2 processes, stage 2, 4 steps of 16 tokens, the least
    whose losses show an update (the config's WarmupLR runs updates 1 and 2 at 0); the same batches,
    so fp32 losses within 1e-6. Step 2 is
    traced (`--trace-steps 2`): a script's run writes the same timeline as the built-in workload's."""
    done = subprocess.run(
        [ZERO_LAB, "compare", "--script", str(REPO / "examples" / "accelerate_loop.py"), "--gpus", "2", "--device",
         "cpu", "--stages", "2", "--out", str(tmp_path), "--name", "cmp", "--format", "json",
         "--stall-timeout", "600", "--trace-steps", "2", "--", "--max-steps", "4", "--seq-len", "16"],
        capture_output=True, text=True, timeout=1200, cwd=REPO)
    assert done.returncode == 0, done.stderr[-4000:]
    comparison = json.loads((tmp_path / "cmp" / "compare.json").read_text())
    assert comparison["verdict"]["ok"] and comparison["verdict"]["loss_parity"] is True
    assert comparison["verdict"]["updates_compared"] == 1
    rows = {row["impl"]: row for row in comparison["rows"]}
    assert set(rows) == {"nano", "official"}
    for row in rows.values():
        assert (row["status"], row["steps"], row["world_size"], row["stage"]) == ("ok", 4, 2, 2)
    [delta] = comparison["deltas"]
    assert delta["max_step_loss_delta"] <= 1e-6
    assert {entry["impl"]: entry["steps"] for entry in comparison["comm_summary"]} == {"nano": [2], "official": [2]}
    own_phases = {"nano": ["reduce_gradients", "unscale_clip", "all_gather"],
                  "official": ["optimizer_gradients", "optimizer_step", "optimizer_allgather"]}
    for impl, category in (("nano", "nano"), ("official", "deepspeed")):
        run = tmp_path / "cmp" / "cells" / f"w2-s2-{impl}"
        rank_traces = traces.read_traces(run)
        assert [trace["distributedInfo"]["rank"] for trace in rank_traces] == [0, 1]
        for trace in rank_traces:
            assert list(traces.step_windows(trace)) == [2]
            assert [span["name"] for span in traces.spans(trace, "phase")] == ["forward", "backward", "optimizer step"]
            assert [name for name in own_phases[impl]
                    if name in [span["name"] for span in traces.spans(trace, category)]] == own_phases[impl]
        step_2 = parse_file(run / "logs" / "rank0.stdout.log").steps[1]
        highest = max(max(value for _, value in traces.memory_series(trace)) for trace in rank_traces)
        assert abs(highest - step_2["peak_alloc_max_mb"] * MB) <= 0.5e-4 * MB  # the exact tracker's peak


def test_a_trainer_that_saves_at_stage_3_without_the_16bit_gather_is_told_by_the_doctor(tmp_path):
    """examples/hf_trainer.py with save_strategy "steps" at stage 3, the config without
    stage3_gather_16bit_weights_on_model_save: the Trainer's save_model finds no whole weights, says so
    on stderr and saves the engine's checkpoint instead; the doctor reads that, not only [ckpt] lines."""
    done = subprocess.run(
        [ZERO_LAB, "compare", "--script", str(REPO / "examples" / "hf_trainer.py"), "--gpus", "2", "--device", "cpu",
         "--stages", "3", "--impls", "nano", "--out", str(tmp_path), "--name", "saved", "--format", "json",
         "--stall-timeout", "600", "--", "--max-steps", "2", "--save-steps", "2"],
        capture_output=True, text=True, timeout=1200, cwd=REPO)
    assert done.returncode == 0, done.stderr[-4000:]
    found = subprocess.run([ZERO_LAB, "doctor", str(tmp_path / "saved"), "--format", "json"], capture_output=True,
                           text=True, timeout=300, cwd=REPO)
    [finding] = [finding for finding in json.loads(found.stdout)["findings"]
                 if finding["code"] == "no-16bit-weights-on-save"]
    assert finding["figures"]["trainer_saves"] and finding["title"].endswith(
        "the Hugging Face Trainer saved without the model's whole weights")
