"""Counting a model's parameters by building it on the meta device, for `zero-lab estimate`.

A preset is built by the workload's own `build_model` (the model a run trains); a local Hugging
Face directory from its config alone, since from_pretrained would read the weights. Nothing is
allocated: every tensor is on meta.
"""

from __future__ import annotations

import json

from zero_lab.cli import input_checks
from zero_lab.cli.errors import BadInput


def count_parameters(model: str) -> tuple[int, int, list[tuple[int, str]]]:
    """(parameters, largest layer's own parameters, stage 3's flat buffers) of a preset or local
    HF model, built on meta; the buffers follow the harness's zero3.json (its persistence threshold)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from zero_lab.nano.config import load_config
    from zero_lab.workload.models import PRESETS, build_model, check_model_name
    from zero_lab.workload.state_formula import flat_buffers

    check_model_name(model, flag="--model")
    with torch.device("meta"):
        if model in PRESETS:
            network = build_model(model, seed=0)
        else:
            try:
                network = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model, local_files_only=True))
            except (OSError, ValueError) as error:  # what Hugging Face raises for a config it cannot read
                problem = (str(error).strip().splitlines() or [type(error).__name__])[0].rstrip(".")
                raise BadInput(f"cannot read the model config in {model}: {problem}",
                               "give a Hugging Face model directory or a parameter count (600M, 1.5B)")
    total = sum(parameter.numel() for parameter in network.parameters())
    largest = max(sum(p.numel() for p in module.parameters(recurse=False)) for module in network.modules())
    stage3 = load_config(json.loads(input_checks.default_config_path(3).read_text()))
    return total, largest, flat_buffers(network, stage3)
