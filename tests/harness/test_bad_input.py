"""Bad input to harness/train.py: one line `error: <problem>. <fix>` on stderr, exit code 2,
before any engine starts."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from zero_lab.workload.errors import WorkloadError
from zero_lab.workload.run_config import rank_device

REPO = Path(__file__).resolve().parents[2]
TRAIN = REPO / "harness" / "train.py"  # the documented script


@pytest.fixture(scope="module")
def train_module():
    from zero_lab.harness import train

    return train


@pytest.fixture
def single_rank(monkeypatch):
    for key, value in dict(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1").items():
        monkeypatch.setenv(key, value)


def refuse(train_module, capsys, *argv: str) -> str:
    assert train_module.main(list(argv)) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1, err
    return err


def test_unknown_preset_and_missing_model_directory(train_module, capsys, single_rank, tmp_path):
    assert "neither a preset" in refuse(train_module, capsys, "--model-name", "huge")
    assert "neither a preset" in refuse(train_module, capsys, "--model-name", str(tmp_path / "gone"))
    assert "no config.json" in refuse(train_module, capsys, "--model-name", str(tmp_path))


def test_malformed_dataset(train_module, capsys, single_rank, tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "fine"}\n{"text": oops}\n')
    assert "line 2 is not valid JSON" in refuse(train_module, capsys, "--dataset-path", str(bad))
    prompt_only = tmp_path / "prompt_only.jsonl"
    prompt_only.write_text('{"conversations": ["only a prompt"]}\n')
    assert "no assistant turn" in refuse(train_module, capsys, "--dataset-path", str(prompt_only))
    latin1 = tmp_path / "latin1.jsonl"
    latin1.write_bytes('{"text": "café"}\n'.encode("latin-1"))
    assert "is not UTF-8" in refuse(train_module, capsys, "--dataset-path", str(latin1))


def test_every_rank_that_refuses_its_input_says_why(train_module, capsys, monkeypatch, tmp_path):
    """Rank 1 may be the first to exit, and torchrun then stops rank 0 before it prints."""
    for key, value in dict(RANK="1", LOCAL_RANK="1", WORLD_SIZE="2", LOCAL_WORLD_SIZE="2").items():
        monkeypatch.setenv(key, value)
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    assert "holds no records" in refuse(train_module, capsys, "--dataset-path", str(empty))
    assert "is a directory" in refuse(train_module, capsys, "--dataset-path", str(tmp_path))


def test_config_stage_contradicting_zero_stage(train_module, capsys, single_rank):
    err = refuse(train_module, capsys, "--deepspeed_config", str(REPO / "harness/configs/zero2.json"),
                 "--zero-stage", "1")
    assert "sets zero_optimization.stage 2 but --zero-stage is 1" in err


def test_bad_config_key_is_named(train_module, capsys, single_rank, tmp_path):
    config = tmp_path / "typo.json"
    config.write_text(json.dumps({"train_micro_batch_size_per_gpu": 1, "zero_optimisation": {}}))
    assert "zero_optimisation" in refuse(train_module, capsys, "--deepspeed_config", str(config))


def test_config_value_of_the_wrong_type_is_named(train_module, capsys, single_rank, tmp_path):
    config = tmp_path / "quoted.json"
    config.write_text(json.dumps({"train_micro_batch_size_per_gpu": 1, "gradient_clipping": "1.0",
                                  "zero_optimization": {"reduce_bucket_size": "auto"}}))
    assert "config field 'gradient_clipping' is '1.0'" in refuse(train_module, capsys, "--deepspeed_config", str(config))


def test_config_that_is_not_a_utf8_json_object(train_module, capsys, single_rank, tmp_path):
    listed, latin1 = tmp_path / "list.json", tmp_path / "latin1.json"
    listed.write_text("[1, 2]")
    latin1.write_bytes('{"train_micro_batch_size_per_gpu": 1, "é": 1}'.encode("latin-1"))
    assert "not an object" in refuse(train_module, capsys, "--deepspeed_config", str(listed))
    assert "not UTF-8" in refuse(train_module, capsys, "--deepspeed_config", str(latin1))


def test_fp16_with_official_on_cpu(train_module, capsys, single_rank):
    err = refuse(train_module, capsys, "--impl", "official", "--device", "cpu", "--model-dtype", "float16")
    assert "fp16" in err and "bfloat16" in err


def test_more_processes_than_cuda_devices(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(WorkloadError, match="2 processes per node but only 1 visible CUDA"):
        rank_device("auto", local_world_size=2)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(WorkloadError, match="torch sees no CUDA device"):
        rank_device("cuda", local_world_size=1)


def test_the_script_itself_exits_2_without_a_traceback():
    done = subprocess.run([sys.executable, str(TRAIN), "--model-name", "huge"], capture_output=True,
                          text=True, timeout=600, cwd=REPO)  # a bound against a hang, not a speed test
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.startswith("error: --model-name 'huge' is neither a preset")
    assert done.stderr.count("\n") == 1
