"""LR schedules and fp16 loss scaling against official DeepSpeed's own classes, step by step."""

import random

import pytest
import torch

from zero_lab.nano.config import Fp16Config
from zero_lab.nano.loss_scaler import LossScaler
from zero_lab.nano.facade import lr_schedules

SCHEDULES = [
    ("WarmupLR", {"warmup_min_lr": 0.0, "warmup_max_lr": 0.01, "warmup_num_steps": 10}),
    ("WarmupLR", {"warmup_min_lr": 1e-4, "warmup_max_lr": 0.01, "warmup_num_steps": 7, "warmup_type": "linear"}),
    ("WarmupLR", {"warmup_num_steps": 5}),
    ("WarmupDecayLR", {"total_num_steps": 30, "warmup_min_lr": 0.0, "warmup_max_lr": 0.01, "warmup_num_steps": 10}),
    ("WarmupDecayLR", {"total_num_steps": 20, "warmup_max_lr": 0.003, "warmup_num_steps": 4, "warmup_type": "linear"}),
    ("WarmupCosineLR", {"total_num_steps": 30, "warmup_num_steps": 10}),
    ("WarmupCosineLR", {"total_num_steps": 25, "warmup_min_ratio": 0.1, "warmup_num_steps": 5,
                        "cos_min_ratio": 0.01, "warmup_type": "linear"}),
]


def two_group_optimizer():
    weights = [torch.nn.Parameter(torch.zeros(2)), torch.nn.Parameter(torch.zeros(3))]
    return torch.optim.AdamW([{"params": [weights[0]], "lr": 0.01}, {"params": [weights[1]], "lr": 0.002}])


@pytest.mark.parametrize("name,params", SCHEDULES, ids=[f"{name}-{i}" for i, (name, _) in enumerate(SCHEDULES)])
def test_schedule_matches_deepspeed_at_every_step(name, params):
    from deepspeed.runtime import lr_schedules as official_schedules
    ours_optimizer, theirs_optimizer = two_group_optimizer(), two_group_optimizer()
    ours = lr_schedules.build_scheduler(name, dict(params), ours_optimizer)
    theirs = getattr(official_schedules, name)(theirs_optimizer, **params)
    for step in range(40):
        assert [g["lr"] for g in ours_optimizer.param_groups] == pytest.approx(
            [g["lr"] for g in theirs_optimizer.param_groups], rel=1e-12, abs=1e-15), f"step {step}"
        ours.step()
        theirs.step()


def test_wrong_schedule_parameter_is_a_config_error():
    with pytest.raises(Exception, match="scheduler.params for WarmupLR"):
        lr_schedules.build_scheduler("WarmupLR", {"warmup_steps": 3}, two_group_optimizer())


@pytest.mark.parametrize("hysteresis,consecutive,window", [(2, False, 3), (1, False, 2), (3, True, 4)])
def test_dynamic_loss_scale_follows_deepspeed(monkeypatch, hysteresis, consecutive, window):
    from deepspeed.runtime.fp16 import loss_scaler as official
    monkeypatch.setattr(official.dist, "get_rank", lambda *args, **kwargs: 0)
    config = Fp16Config(enabled=True, initial_scale_power=10, loss_scale_window=window, hysteresis=hysteresis,
                        consecutive_hysteresis=consecutive, min_loss_scale=0.25)
    ours = LossScaler(config)
    theirs = official.DynamicLossScaler(init_scale=2 ** 10, scale_window=window, min_scale=0.25,
                                        delayed_shift=hysteresis, consecutive_hysteresis=consecutive,
                                        raise_error_at_min_scale=False)
    pattern = random.Random(hysteresis * 10 + window)
    for step in range(60):
        overflow = pattern.random() < 0.3
        ours.update_scale(overflow)
        theirs.update_scale(overflow)
        assert (ours.cur_scale, ours.cur_hysteresis) == (theirs.cur_scale, theirs.cur_hysteresis), f"step {step}"


def test_static_and_disabled_scales_never_move():
    static = LossScaler(Fp16Config(enabled=True, loss_scale=128.0))
    disabled = LossScaler(Fp16Config(enabled=False))
    for overflow in (True, False, True):
        static.update_scale(overflow)
        disabled.update_scale(overflow)
    assert (static.loss_scale, disabled.loss_scale) == (128.0, 1.0)


def test_overflow_at_the_minimum_scale_is_an_error_as_in_deepspeed():
    scaler = LossScaler(Fp16Config(enabled=True, initial_scale_power=1, hysteresis=1, min_loss_scale=1.0))
    scaler.update_scale(True)
    assert scaler.loss_scale == 1.0
    with pytest.raises(RuntimeError, match="min_loss_scale"):
        scaler.update_scale(True)


def tensor_lr_optimizer():
    weights = [torch.nn.Parameter(torch.zeros(2)), torch.nn.Parameter(torch.zeros(3))]
    return torch.optim.AdamW([{"params": [weights[0]], "lr": torch.tensor(0.01)},
                              {"params": [weights[1]], "lr": torch.tensor(0.002)}])


@pytest.mark.parametrize("name,params", [
    ("WarmupLR", {"warmup_min_lr": 0.0, "warmup_max_lr": 0.01, "warmup_num_steps": 4, "warmup_type": "cubic"}),
    ("WarmupDecayLR", {"total_num_steps": 12, "warmup_num_steps": 4, "warmup_type": "exponential"}),
    ("WarmupCosineLR", {"total_num_steps": 12, "warmup_num_steps": 4, "warmup_type": "?"}),
    ("WarmupLR", {"warmup_num_steps": 4}),
    ("WarmupCosineLR", {"total_num_steps": 12, "warmup_num_steps": 4}),
], ids=["unknown-type-WarmupLR", "unknown-type-WarmupDecayLR", "unknown-type-WarmupCosineLR",
        "tensor-lr-WarmupLR", "tensor-lr-WarmupCosineLR"])
def test_unknown_warmup_type_and_tensor_lrs_as_deepspeed(name, params, caplog):
    """An unknown warmup_type warns and warms up as "log"; a tensor lr is filled in place (the same
    tensor object stays in the group). Both against DeepSpeed's own classes, at every step."""
    from deepspeed.runtime import lr_schedules as official_schedules
    ours_optimizer, theirs_optimizer = tensor_lr_optimizer(), tensor_lr_optimizer()
    tensors = [group["lr"] for group in ours_optimizer.param_groups]
    ours = lr_schedules.build_scheduler(name, dict(params), ours_optimizer)
    theirs = getattr(official_schedules, name)(theirs_optimizer, **params)
    if params.get("warmup_type") not in (None, "log", "linear"):
        assert "warmup_type" in caplog.text and ours.warmup_type == "log"
    for step in range(14):
        assert [float(g["lr"]) for g in ours_optimizer.param_groups] == pytest.approx(
            [float(g["lr"]) for g in theirs_optimizer.param_groups], rel=1e-6, abs=1e-12), f"step {step}"
        assert all(group["lr"] is tensor for group, tensor in zip(ours_optimizer.param_groups, tensors))
        ours.step()
        theirs.step()
