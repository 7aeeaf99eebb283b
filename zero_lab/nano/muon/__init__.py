"""Muon with ZeRO: official DeepSpeed 0.19.8's `"optimizer": {"type": "Muon"}`, in nano.

A room beside the stage path (no stage module imports it): `initialize` calls it when the config's
optimizer is Muon, in three phases of its own.
    Phase 4 (groups):    `check` refuses what nano's Muon does not do; `groups.tag_parameters` tags
                         the model's 2-D hidden weights `use_muon`, and `groups.split_groups`
                         splits each parameter group into a Muon half and an AdamW half.
    Phase 5 (optimizer): the stage's ZeRO optimizer is built from those groups as for Adam (one flat
                         buffer per unit and half), then `install` puts `PartitionedMuon` in
                         Adam's place: the same masters, plus the step's Phase 2b (whole matrices).
Files: `newton_schulz.py` (the update of one matrix), `groups.py` (tagging, the halves),
`partitioned_muon.py` (the gathers, the momentum, the step). docs/muon.md tells the story.
"""

from __future__ import annotations

from zero_lab.nano.errors import NanoConfigError
from zero_lab.nano.muon.groups import split_groups, tag_parameters

__all__ = ["check", "install", "split_groups", "tag_parameters"]


def check(config, client_optimizer) -> None:
    """Refuse, in one line naming the fix, what nano's Muon does not run."""
    zero = config.zero_optimization
    problems = [
        (client_optimizer is not None, "an optimizer= object", "drop optimizer= and let the config build Muon"),
        (config.precision == "fp16", "fp16", "use bf16 or fp32"),
        (zero.offload_optimizer.enabled or zero.offload_param.enabled, "CPU offload",
         "remove offload_optimizer/offload_param"),
        (zero.hpz_enabled or zero.zero_quantized_weights or zero.zero_quantized_gradients, "ZeRO++",
         "remove zero_hpz_partition_size/zero_quantized_weights/zero_quantized_gradients"),
    ]
    for refused, what, fix in problems:
        if refused:
            raise NanoConfigError(f"nano's Muon does not run with {what}; {fix}, or use AdamW")


def install(zero_optimizer, config):
    """Phase 5: Muon as the ZeRO optimizer's partition optimizer, in Adam's place; returns it (the LR
    schedule's optimizer).
    Imported here: the room's pure part (`groups`) serves `explain`, which loads no torch."""
    from zero_lab.nano.muon.partitioned_muon import PartitionedMuon

    # Where the momentum lives, as official keeps it: partitioned where the parameters are (stage 3).
    zero_optimizer.partition_optimizer = PartitionedMuon(
        zero_optimizer, config.optimizer.decoupled_weight_decay,
        partitioned_momentum=zero_optimizer.stage_facts.partitions_parameters)
    return zero_optimizer.partition_optimizer
