"""`--optimizer adamw|muon` (zero_lab/workload/optimizer_choice.py) and the checks of Muon runs:
pure functions, nothing launched."""

import json

import pytest

from zero_lab.nano.config import load_config
from zero_lab.workload.errors import WorkloadError
from zero_lab.workload.optimizer_choice import uses_muon, with_optimizer
from zero_lab.workload.run_config import CONFIG_DIR, build_parser, check_launch

ZERO2 = json.loads((CONFIG_DIR / "zero2.json").read_text())


def test_muon_keeps_the_configs_adamw_settings_for_its_adamw_half():
    config = with_optimizer(ZERO2, "muon")
    params = config["optimizer"]["params"]
    assert config["optimizer"]["type"] == "Muon" and uses_muon(config)
    assert (params["adam_lr"], params["betas"], params["weight_decay"]) == (0.001, [0.9, 0.95], 0.1)
    settings = load_config(config, world_size=2).optimizer.params
    assert settings.muon_lr is None and settings.momentum == 0.95  # Muon's half keeps official's defaults
    assert with_optimizer(config, "adamw")["optimizer"] == {"type": "AdamW", "params": {
        "lr": 0.001, "betas": [0.9, 0.95], "eps": 1e-08, "weight_decay": 0.1}}
    assert with_optimizer(ZERO2, None) is ZERO2 and with_optimizer(ZERO2, "adamw") is ZERO2


@pytest.mark.parametrize("flags,named", [
    (["--save-dir", "runs/x"], "--save-dir and --resume are not supported with Muon"),
    (["--resume", "--save-dir", "runs/x"], "--save-dir and --resume are not supported with Muon"),
])
def test_muon_runs_refuse_what_they_do_not_support(flags, named):
    args = build_parser().parse_args(["--optimizer", "muon", "--device", "cpu", *flags])
    with pytest.raises(WorkloadError, match=named):
        check_launch(args, world_size=2, local_world_size=2)


def test_a_bad_muon_key_is_named_with_its_path():
    config = {**ZERO2, "optimizer": {"type": "Muon", "params": {"momentum": 1.5}}}
    with pytest.raises(ValueError, match="optimizer.params.momentum"):
        load_config(config, world_size=2)
