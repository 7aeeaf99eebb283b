"""Counting a model's parameters by building it on the meta device, for `zero-lab estimate`.

`workload.models.meta_model` builds it: a preset as the workload builds it (the model a run
trains), a local Hugging Face directory or config.json from its config alone, since from_pretrained
would read the weights. Nothing is allocated: every tensor is on meta.
"""

from __future__ import annotations

import json

from zero_lab.cli import input_checks


def count_parameters(model: str) -> tuple[int, int, list[tuple[int, str]]]:
    """(parameters, largest layer's own parameters, stage 3's flat buffers) of a preset or local
    HF model, built on meta; the buffers follow the harness's zero3.json (its persistence threshold)."""
    from zero_lab.nano.config import load_config
    from zero_lab.workload.models import meta_model
    from zero_lab.workload.state_formula import flat_buffers

    network = meta_model(model)
    total = sum(parameter.numel() for parameter in network.parameters())
    largest = max(sum(p.numel() for p in module.parameters(recurse=False)) for module in network.modules())
    stage3 = load_config(json.loads(input_checks.default_config_path(3).read_text()))
    return total, largest, flat_buffers(network, stage3)
