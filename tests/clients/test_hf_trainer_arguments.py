"""examples/hf_trainer.py's TrainingArguments, made from the harness's configs: on a machine without a
GPU a bf16 config must give arguments the Trainer accepts (it refuses bf16 there unless told that it
runs on the CPU on purpose: `use_cpu`), and an fp32 one arguments as before."""

import argparse
import importlib.util
import json
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]


def hf_trainer(monkeypatch):
    monkeypatch.syspath_prepend(str(REPO / "examples"))  # its own imports (tiny_llama) sit beside it
    spec = importlib.util.spec_from_file_location("hf_trainer_example", REPO / "examples" / "hf_trainer.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.skipif(torch.cuda.is_available(), reason="the Trainer's CPU-only refusal")
@pytest.mark.parametrize("bf16", [True, False], ids=["bf16", "fp32"])
def test_the_arguments_of_a_cpu_run_are_accepted(tmp_path, monkeypatch, bf16):
    config = json.loads((REPO / "zero_lab" / "harness" / "configs" / "zero2.json").read_text())
    config["bf16"] = {"enabled": bf16}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    args = argparse.Namespace(deepspeed_config=str(path), max_steps=2, seed=42, save_steps=0)
    arguments = hf_trainer(monkeypatch).training_arguments(config, args, str(tmp_path / "out"))
    assert arguments.bf16 is bf16 and arguments.use_cpu is bf16 and arguments.device.type == "cpu"
