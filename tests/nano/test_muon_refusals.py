"""What nano's Muon refuses, each in one line naming the fix: one process, no launch."""

import pytest

import zero_lab.nano as nano
from zero_lab.nano.errors import CheckpointError, NanoConfigError
from tests.nano.reference import build_model
from tests.nano.test_engine_api import single_process  # noqa: F401 (the fixture: a world of one, its own port)


def config(**extra) -> dict:
    zero = {"stage": 2, **extra.pop("zero", {})}
    return {"train_micro_batch_size_per_gpu": 2, "optimizer": {"type": "Muon"}, "zero_optimization": zero, **extra}


@pytest.mark.parametrize("extra,named", [
    ({"fp16": {"enabled": True}}, "nano's Muon does not run with fp16; use bf16 or fp32"),
    ({"zero": {"offload_optimizer": {"device": "cpu"}}}, "nano's Muon does not run with CPU offload"),
])
def test_what_muon_does_not_run_is_refused_in_one_line(extra, named, single_process):
    with pytest.raises(NanoConfigError, match=named) as raised:
        nano.initialize(model=build_model(), config=config(**extra))
    assert "\n" not in str(raised.value)


def test_checkpoints_of_a_muon_run_are_refused(tmp_path, single_process):
    engine, *_ = nano.initialize(model=build_model(), config=config())
    with pytest.raises(CheckpointError, match="do not hold Muon's momentum"):
        engine.save_checkpoint(str(tmp_path))
    with pytest.raises(CheckpointError, match="do not hold Muon's momentum"):
        engine.load_checkpoint(str(tmp_path))
    assert not any(tmp_path.iterdir())


def test_the_tagging_rule_and_the_halves_are_officials(single_process):
    """Matrices but embeddings and the head go to Muon, largest shape first; each half its own defaults."""
    import torch

    model = torch.nn.ModuleDict({"embed_tokens": torch.nn.Embedding(11, 4), "small": torch.nn.Linear(4, 3),
                                 "big": torch.nn.Linear(4, 6), "lm_head": torch.nn.Linear(4, 11, bias=False)})
    engine, optimizer, *_ = nano.initialize(model=model, config=config())
    groups = {group["name"]: group for group in optimizer.param_groups}
    assert list(groups) == ["muon-params", "adam-params"]
    muon, adam = groups["muon-params"], groups["adam-params"]
    assert (muon["lr"], muon["momentum"], adam["lr"], adam["betas"], adam["eps"]) == (0.02, 0.95, 3e-4, (0.9, 0.95), 1e-10)
    assert [parameter.use_muon for parameter in model.parameters()] == [False, True, False, True, False, False]
    assert optimizer.buffers[0].parameters == [model["big"].weight, model["small"].weight]  # (6, 4) before (3, 4)
