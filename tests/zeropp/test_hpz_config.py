"""ZeRO++'s keys as nano reads them: zero_hpz_partition_size (stage 3 only, a divisor of the world size) and zero_quantized_weights (stage 3 only)."""

from __future__ import annotations

import pytest

from zero_lab.nano.config import load_config
from zero_lab.nano.errors import NanoConfigError
from zero_lab.nano.zeropp.hierarchical_partition import Stage3HierarchicalOptimizer
from zero_lab.nano.facade.initialize import STAGE_OPTIMIZERS, stage_optimizer


def config(stage: int, partition_size: int) -> dict:
    return {"train_micro_batch_size_per_gpu": 1, "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
            "zero_optimization": {"stage": stage, "zero_hpz_partition_size": partition_size}}


def test_hpz_is_read_at_stage_3_and_picks_the_hierarchical_optimizer():
    settings = load_config(config(3, 2), world_size=4)
    assert settings.zero_optimization.zero_hpz_partition_size == 2
    assert stage_optimizer(settings, 4) is Stage3HierarchicalOptimizer
    assert stage_optimizer(settings, 1) is STAGE_OPTIMIZERS[(3, "")]  # one rank: nothing to partition twice (official: min(K, W))
    for off in (0, 1):  # official's default is 1; 0 is accepted as off too
        assert stage_optimizer(load_config(config(3, off), world_size=4), 4) is STAGE_OPTIMIZERS[(3, "")]


def test_hpz_below_stage_3_or_not_dividing_the_world_is_refused_by_name():
    with pytest.raises(NanoConfigError, match="zero_hpz_partition_size 2 partitions parameters a second time"):
        load_config(config(2, 2), world_size=4)
    with pytest.raises(NanoConfigError, match="zero_hpz_partition_size 3 does not divide the world size 4"):
        load_config(config(3, 3), world_size=4)


def test_qwz_is_read_at_stage_3_and_picks_its_optimizer_alone_and_with_hpz():
    from zero_lab.nano.zeropp.quantized_weights import (Stage3HierarchicalQuantizedWeightsOptimizer,
                                                 Stage3QuantizedWeightsOptimizer)

    settings = config(3, 1)
    settings["zero_optimization"]["zero_quantized_weights"] = True
    assert stage_optimizer(load_config(settings, world_size=4), 4) is Stage3QuantizedWeightsOptimizer
    assert stage_optimizer(load_config(settings, world_size=1), 1) is Stage3QuantizedWeightsOptimizer  # the round trip
    settings["zero_optimization"]["zero_hpz_partition_size"] = 2
    assert stage_optimizer(load_config(settings, world_size=4), 4) is Stage3HierarchicalQuantizedWeightsOptimizer
    settings["zero_optimization"].update(stage=2, zero_hpz_partition_size=1)
    with pytest.raises(NanoConfigError, match="zero_quantized_weights quantizes the gathers of partitioned parameters"):
        load_config(settings, world_size=4)


@pytest.mark.parametrize("hpz, qwz, qgz", [(hpz, qwz, qgz) for hpz in (1, 2) for qwz in (False, True)
                                           for qgz in (False, True)])
def test_the_config_says_what_the_buffer_class_does_about_gathering_with_others(hpz, qwz, qgz):
    """explain reads `gathers_each_buffer_alone` from the config; the engine asks the sharded buffer
    class its optimizer builds. The two must agree for every ZeRO++ combination."""
    settings = load_config({**config(3, hpz), "zero_optimization": {
        "stage": 3, "zero_hpz_partition_size": hpz, "zero_quantized_weights": qwz,
        "zero_quantized_gradients": qgz}}, world_size=4)
    optimizer = stage_optimizer(settings, 4)
    buffer_class = optimizer.hierarchical_buffer if hpz > 1 else optimizer.sharded_buffer
    assert buffer_class.gathers_with_others is not settings.zero_optimization.gathers_each_buffer_alone
