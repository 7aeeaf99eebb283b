"""A run saved by one engine resumes under another, at another world size, through
`zero-lab checkpoint convert`, and its losses after the checkpoint equal an uninterrupted run of
the target engine at the target world size (issue 36's three resume cases):
    1. official stage 2 at W=2 -> dcp -> FSDP2 at W=3
    2. FSDP2 at W=2 -> deepspeed (stage 3, cut for 3 ranks) -> nano stage 3 at W=3
    3. nano stage 1 at W=2 -> universal -> official stage 1 at W=3 (its `load_universal` option)
The global batch is the same at both world sizes (3 rows a rank at W=2, 2 at W=3: data.py's global
rows), so the saving run's first step is the target's first step. One step is saved and two run
after the load: the loss of the third depends on Adam's moments and step having travelled.

One module fixture trains all saving runs in one spawned world of 2 ranks, converts each with the
CLI, then trains every resumed run and every uninterrupted reference in one world of 3 ranks.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from typer.testing import CliRunner

from tests.harness.test_train_torchrun import REPO, read_log
from tests.harness_world import train_in_world
from zero_lab.analysis.compare.metrics import resolve_loss_tol
from zero_lab.cli.app import app

pytestmark = [pytest.mark.slow, pytest.mark.official]

SAVED_STEPS, STEPS = 1, 3
CONFIGS = REPO / "harness" / "configs"


def arguments(impl: str, stage: int, batch_size: int, steps: int, config=None, save_dir=None, resume=False):
    argv = ["--impl", impl, "--deepspeed_config", str(config or CONFIGS / f"zero{stage}.json"), "--model-name",
            "tiny", "--steps", str(steps), "--batch-size", str(batch_size), "--seq-len", "32", "--seed", "0",
            "--device", "cpu"]
    if save_dir is not None:
        argv += ["--save-dir", str(save_dir)] + (["--resume"] if resume else [])
    return argv


CASES = {  # name: (source impl, stage, format, convert's extra flags, target impl, stage)
    "official-to-fsdp2": ("official", 2, "dcp", [], "fsdp2", 2),
    "fsdp2-to-nano": ("fsdp2", 2, "deepspeed", ["--stage", "3", "--world-size", "3"], "nano", 3),
    "nano-to-official": ("nano", 1, "universal", [], "official", 1),
}


@pytest.fixture(scope="module")
def logs(tmp_path_factory):
    root = tmp_path_factory.mktemp("across")
    universal_config = root / "zero1_universal.json"
    universal_config.write_text(json.dumps({**json.loads((CONFIGS / "zero1.json").read_text()),
                                            "checkpoint": {"load_universal": True}}))
    saved = train_in_world(2, {name: arguments(impl, stage, 3, SAVED_STEPS, save_dir=root / name)
                               for name, (impl, stage, *_) in CASES.items()}, root / "w2")
    converted = {}
    for name, (_, _, format, flags, _, _) in CASES.items():
        done = CliRunner().invoke(app, ["checkpoint", "convert", str(root / name), str(root / f"{name}-{format}"),
                                        "--to", format, *flags])
        assert done.exit_code == 0, done.output
        converted[name] = done.stderr
    resumed = {}
    for name, (_, _, format, _, impl, stage) in CASES.items():
        config = universal_config if format == "universal" else None
        resumed[f"{name}-resumed"] = arguments(impl, stage, 2, STEPS, config, root / f"{name}-{format}", resume=True)
        resumed[f"{name}-reference"] = arguments(impl, stage, 2, STEPS)
    return saved, converted, train_in_world(3, resumed, root / "w3"), root


def losses(text: str) -> dict[int, float]:
    return {step: fields["loss"] for step, fields in read_log(text)["opt_step"]}


@pytest.mark.parametrize("name", list(CASES))
def test_resumed_losses_equal_the_uninterrupted_run_of_the_target_engine(logs, name):
    saved, converted, runs, _ = logs
    assert f"converting " in converted[name] and "predicted peak" in converted[name]
    resumed, reference = losses(runs[f"{name}-resumed"]), losses(runs[f"{name}-reference"])
    assert sorted(resumed) == list(range(SAVED_STEPS + 1, STEPS + 1)), runs[f"{name}-resumed"]
    assert sorted(reference) == list(range(1, STEPS + 1))
    assert abs(losses(saved[name])[1] - reference[1]) <= resolve_loss_tol(None, ["fp32"])  # the same first step
    deltas = {step: abs(resumed[step] - reference[step]) for step in resumed}
    assert max(deltas.values()) <= resolve_loss_tol(None, ["fp32"]), deltas
    print(f"{name}: loss deltas after the load {deltas}")


def test_deepspeeds_own_ds_to_universal_writes_the_values_our_universal_conversion_writes(logs):
    """Official's checkpoint (stage 2, W=2), through official's ds_to_universal and through ours:
    every parameter's fp32 master, exp_avg and exp_avg_sq equal element for element, and the step."""
    root = logs[3]
    source = root / "official-to-fsdp2"
    tag = (source / "latest").read_text().strip()
    theirs = root / "ds_to_universal"
    done = subprocess.run([sys.executable, "-m", "deepspeed.checkpoint.ds_to_universal", "--input_folder",
                           str(source / tag), "--output_folder", str(theirs / tag), "--inject_missing_state"],
                          capture_output=True, text=True, env={**os.environ, "DS_ACCELERATOR": "cpu"}, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    ours = root / "official-universal"
    converted = CliRunner().invoke(app, ["checkpoint", "convert", str(source), str(ours), "--to", "universal"])
    assert converted.exit_code == 0, converted.output
    names = sorted(path.name for path in (ours / tag / "zero").iterdir() if path.is_dir())
    assert names == sorted(path.name for path in (theirs / tag / "zero").iterdir() if path.is_dir()) and names
    for name in names:
        for file in ("fp32.pt", "exp_avg.pt", "exp_avg_sq.pt"):
            mine, official = (torch.load(base / tag / "zero" / name / file, weights_only=False) for base in (ours, theirs))
            assert torch.equal(mine["param"], official["param"]), (name, file)
        assert float(torch.load(ours / tag / "zero" / name / "step.pt")) == \
            float(torch.load(theirs / tag / "zero" / name / "step.pt", weights_only=False))
