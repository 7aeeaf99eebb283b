"""`zero-lab checkpoint inspect|consolidate|reshard` on a checkpoint nano saved on one process."""

import json

import pytest
import torch
from safetensors.torch import load_file
from typer.testing import CliRunner

from tests.cli.test_cli import one_line_error
from tests.nano.checkpoint_workers import checkpoint_config, snapshot, start, train
from tests.nano.test_engine_api import single_process  # noqa: F401 (the fixture)
from zero_lab.cli.app import app

runner = CliRunner()


@pytest.fixture
def saved(single_process, tmp_path):  # noqa: F811
    engine = start(checkpoint_config(2))
    train(engine, range(2), 0)
    engine.save_checkpoint(str(tmp_path / "ckpt"))
    weights = snapshot(engine)
    engine.destroy()
    return tmp_path, weights


def invoke(*arguments):
    return runner.invoke(app, [str(argument) for argument in arguments])


def test_inspect_reshard_and_consolidate(saved):
    root, weights = saved
    facts = json.loads(invoke("checkpoint", "inspect", root / "ckpt", "--format", "json").stdout)
    assert (facts["written_by"], facts["stage"], facts["world_size"], facts["precision"], facts["global_steps"]) == \
        ("nano", 2, 1, "fp32", 2)
    assert facts["parameters"] == sum(values.numel() for name, values in weights.items())
    assert set(facts["file_bytes"]) == {"mp_rank_00_model_states.pt", "zero_pp_rank_0_mp_rank_00_optim_states.pt"}
    assert facts["config"]["zero_optimization"]["stage"] == 2
    resharded = json.loads(invoke("checkpoint", "reshard", root / "ckpt", "--world-size", 3, "--out", root / "w3",
                                  "--format", "json").stdout)
    assert resharded["world_size"] == 3 and len([name for name in resharded["file_bytes"] if "optim" in name]) == 3
    for source, out in (("ckpt", "a.safetensors"), ("w3", "b.safetensors")):
        result = invoke("checkpoint", "consolidate", root / source, "--out", root / out, "--format", "json")
        assert result.exit_code == 0, result.output
        loaded = load_file(str(root / out))
        assert all(torch.equal(loaded[name], weights[name]) for name in weights)


def test_bad_checkpoints_and_outputs_are_one_line_with_nothing_overwritten(saved):
    root, _ = saved
    assert "does not exist" in one_line_error(invoke("checkpoint", "inspect", root / "nowhere"))
    assert "tag 'global_step5' does not exist" in one_line_error(
        invoke("checkpoint", "inspect", root / "ckpt", "--tag", "global_step5"))
    (root / "taken.safetensors").write_bytes(b"keep")
    assert "exists" in one_line_error(invoke("checkpoint", "consolidate", root / "ckpt", "--out",
                                             root / "taken.safetensors"))
    assert (root / "taken.safetensors").read_bytes() == b"keep"
    assert "exists" in one_line_error(invoke("checkpoint", "reshard", root / "ckpt", "--world-size", 2,
                                             "--out", root / "ckpt"))
    # a new checkpoint inside the one it reads would become one of its tags: refused, nothing written
    for command in (("checkpoint", "convert", root / "ckpt", root / "ckpt" / "inside", "--to", "dcp"),
                    ("checkpoint", "reshard", root / "ckpt", "--world-size", 2, "--out", root / "ckpt" / "inside")):
        assert "is inside the checkpoint it reads" in one_line_error(invoke(*command))
        assert not (root / "ckpt" / "inside").exists()
    optimizer_file = root / "ckpt" / "global_step2" / "zero_pp_rank_0_mp_rank_00_optim_states.pt"
    optimizer_file.write_bytes(optimizer_file.read_bytes()[:100])
    assert "truncated or corrupt" in one_line_error(invoke("checkpoint", "inspect", root / "ckpt"))
