"""`--model` given a Hugging Face config.json alone: a run trains that shape with random weights and
the byte tokenizer, and measures its throughput from the model it built."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from tests.workload.test_models import narrow_config
from zero_lab.cli.app import app
from zero_lab.workload.meters.model_flops import flops_per_token
from zero_lab.workload.models import build_model
from zero_lab.workload.model_shapes import DEFAULT_SEQ_LEN

pytestmark = pytest.mark.slow  # launches torchrun


def test_run_trains_the_shape_a_config_json_gives(tmp_path):
    config = narrow_config(tmp_path)
    result = CliRunner().invoke(app, ["run", "--impl", "nano", "--gpus", "1", "--device", "cpu", "--model", str(config),
                                      "--steps", "4", "--out", str(tmp_path / "runs"), "--name", "narrow",
                                      "--format", "json"])
    assert result.exit_code == 0, result.output[-2000:]
    summary = json.loads((tmp_path / "runs" / "narrow" / "summary.json").read_text())
    built = build_model(str(config), seed=0)
    assert summary["status"] == "ok" and summary["steps"] == 4
    assert summary["params"] == sum(parameter.numel() for parameter in built.parameters())
    assert summary["model"]["name"] == str(config)
    assert summary["flops_per_token"] == flops_per_token(built, DEFAULT_SEQ_LEN)
    assert summary["tflops"] > 0 and summary["mfu_pct"] is None  # a CPU: no peak known
    assert any(update["moved"] for update in summary["updates"].values())  # it trained: parameters moved
