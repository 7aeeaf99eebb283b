"""The model a run trains: a built-in Qwen3 preset with random weights, or a local Hugging Face
directory. Nothing is ever downloaded.

Presets (`presets.py`: tiny, small, qwen3-0.6b) are built as `transformers.Qwen3ForCausalLM`.
Weights come from `torch.manual_seed(seed)` before construction, so every rank and both impls
start from the same weights; the model is built in fp32 and then cast, so the initial values do
not depend on `--model-dtype` beyond rounding.
"""

from __future__ import annotations

from pathlib import Path

import torch

from zero_lab.nano.dtypes import torch_dtype
from zero_lab.workload.errors import WorkloadError, first_line
from zero_lab.workload.model_shapes import PRESETS, SHARED, check_model_name, decays
from zero_lab.workload.tokenizer import ByteTokenizer

# What Hugging Face raises for a bad model directory or attention implementation: a missing or
# unreadable file (OSError), a value it rejects (ValueError), an uninstalled kernel (ImportError).
LOAD_ERRORS = (OSError, ValueError, ImportError)


def load_tokenizer(name: str, trust_remote_code: bool = False):
    """The byte tokenizer for presets; the directory's own tokenizer otherwise."""
    check_model_name(name)
    if name in PRESETS:
        return ByteTokenizer()
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(name, local_files_only=True,
                                             trust_remote_code=trust_remote_code)
    except LOAD_ERRORS as error:
        raise WorkloadError(f"cannot load the tokenizer of {name}: {first_line(error)}",
                            "Give a complete Hugging Face model directory (tokenizer files "
                            "included), with --trust-remote-code if it ships its own code") from None


def build_model(name: str, seed: int, dtype: str = "float32", attn_impl: str | None = None,
                gradient_checkpointing: bool = False, trust_remote_code: bool = False):
    """The causal LM, on CPU, with identical weights for a given seed and name."""
    from transformers import AutoModelForCausalLM, Qwen3Config, Qwen3ForCausalLM

    check_model_name(name)
    torch.manual_seed(seed)
    try:  # Hugging Face checks the attention implementation and the files while it builds
        if name in PRESETS:
            config = Qwen3Config(**PRESETS[name], **SHARED, **({"attn_implementation": attn_impl} if attn_impl else {}))
            model = Qwen3ForCausalLM(config).to(torch_dtype(dtype))
        else:
            model = AutoModelForCausalLM.from_pretrained(
                name, dtype=torch_dtype(dtype), attn_implementation=attn_impl, local_files_only=True,
                trust_remote_code=trust_remote_code)
    except LOAD_ERRORS as error:
        raise WorkloadError(f"cannot build model {name} (--attn-impl {attn_impl}): "
                            f"{first_line(error)}",
                            "Pick an --attn-impl that is installed (eager, sdpa), or fix the model "
                            "directory (config, weights)") from None
    if gradient_checkpointing:
        model.gradient_checkpointing_enable()
    model.config.use_cache = False
    return model


def parameter_groups(model: torch.nn.Module, weight_decay: float) -> list[dict]:
    """Weight decay on matrices only: norms and biases (1-D tensors) are not decayed."""
    trainable = [p for p in model.parameters() if p.requires_grad]
    decay = [p for p in trainable if decays(tuple(p.shape))]
    no_decay = [p for p in trainable if not decays(tuple(p.shape))]
    return [{"params": decay, "weight_decay": weight_decay},
            {"params": no_decay, "weight_decay": 0.0}]


def directory_parameters(path: str):
    """(parameter entries, stage-3 blocks) of a local Hugging Face model, from its config alone:
    the model is built on the meta device (no weights read, no memory), blocks found as nano finds
    them (`stage3_units.fetch_modules`). Presets need none of this: `model_shapes.preset_parameters`."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from zero_lab.nano.policies.stage3_units import fetch_modules, parameter_entries

    check_model_name(path, flag="--model")
    try:
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(path, local_files_only=True))
    except LOAD_ERRORS as error:
        raise WorkloadError(f"cannot read the model config in {path}: {first_line(error)}",
                            "Give a Hugging Face model directory with a readable config.json") from None
    blocks = fetch_modules(model)
    trainable = {parameter for parameter in model.parameters() if parameter.requires_grad}
    return [entry for entry, _ in parameter_entries(model, blocks, trainable)], [name for name, _, _ in blocks]
