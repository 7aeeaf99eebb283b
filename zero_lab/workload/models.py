"""The model a run trains: a built-in Qwen3 preset or a Hugging Face config.json, with random
weights, or a local Hugging Face directory with its weights. Nothing is ever downloaded.

Presets (`model_shapes.py`: tiny, small, qwen3-0.6b) are built as `transformers.Qwen3ForCausalLM`;
a config.json alone (the file, or a directory without weight files: `model_shapes.model_source`)
as the class its `model_type` names, so anyone can measure a model's shape without its weights;
both read text with the byte tokenizer. Random weights come from `torch.manual_seed(seed)` before
construction, so every rank and both impls start from the same weights; the model is built in fp32
and then cast, so the initial values do not depend on `--model-dtype` beyond rounding.
"""

from __future__ import annotations

from pathlib import Path

import torch

from zero_lab.nano.dtypes import torch_dtype
from zero_lab.workload.errors import WorkloadError, first_line
from zero_lab.workload.model_shapes import PRESETS, SHARED, check_model_name, config_path, decays, model_source
from zero_lab.workload.tokenizer import ByteTokenizer

# What Hugging Face raises for a bad model directory or attention implementation: a missing or
# unreadable file (OSError), a value it rejects (ValueError), an uninstalled kernel (ImportError),
# a config its strict dataclass validation refuses (huggingface_hub's StrictDataclassError).
try:
    from huggingface_hub.errors import StrictDataclassError
except ImportError:  # an older huggingface_hub: its configs are not strict dataclasses
    StrictDataclassError = ValueError
LOAD_ERRORS = (OSError, ValueError, ImportError, StrictDataclassError)


def load_tokenizer(name: str, trust_remote_code: bool = False):
    """The byte tokenizer for presets and a config.json alone; the directory's own tokenizer otherwise."""
    check_model_name(name)
    if model_source(name) != "pretrained":
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
    attention = {"attn_implementation": attn_impl} if attn_impl else {}
    try:  # Hugging Face checks the attention implementation and the files while it builds
        if name in PRESETS:
            model = Qwen3ForCausalLM(Qwen3Config(**PRESETS[name], **SHARED, **attention)).to(torch_dtype(dtype))
        elif model_source(name) == "config":
            config = read_config(name, trust_remote_code)
            check_byte_vocabulary(config, name)
            model = AutoModelForCausalLM.from_config(config, trust_remote_code=trust_remote_code,
                                                     **attention).to(torch_dtype(dtype))
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


def read_config(name: str, trust_remote_code: bool = False):
    """The Hugging Face config of a model that is not a preset (its config.json: the file, or the
    directory's); WorkloadError for one Hugging Face cannot read."""
    from transformers import AutoConfig

    path = config_path(name)
    try:
        return AutoConfig.from_pretrained(str(path), local_files_only=True, trust_remote_code=trust_remote_code)
    except LOAD_ERRORS as error:
        raise WorkloadError(f"cannot read the model config {path}: {first_line(error)}",
                            "Give a Hugging Face config.json with its model_type, as the Hub publishes it") from None


def check_byte_vocabulary(config, name: str) -> None:
    """A model built from a config alone reads text with the byte tokenizer: its vocabulary must hold those ids."""
    vocabulary = getattr(config, "vocab_size", None)
    if not isinstance(vocabulary, int) or vocabulary < ByteTokenizer.vocab_size:
        raise WorkloadError(f"{config_path(name)} has vocab_size {vocabulary}: a model built from a config alone reads "
                            f"text with the byte tokenizer, which needs {ByteTokenizer.vocab_size} token ids",
                            f"Set vocab_size to {ByteTokenizer.vocab_size} or more")


def meta_model(name: str):
    """The model a name describes, on the meta device (no weights read, no memory): a preset by
    `build_model`, anything else from its config alone (from_pretrained would read the weights)."""
    from transformers import AutoModelForCausalLM

    check_model_name(name, flag="--model")
    with torch.device("meta"):
        if name in PRESETS:
            return build_model(name, seed=0)
        config = read_config(name)
        try:
            return AutoModelForCausalLM.from_config(config)
        except LOAD_ERRORS as error:
            raise WorkloadError(f"cannot build a model from {config_path(name)}: {first_line(error)}",
                                "Give the config.json of a causal language model") from None


def parameter_groups(model: torch.nn.Module, weight_decay: float) -> list[dict]:
    """Weight decay on matrices only: norms and biases (1-D tensors) are not decayed."""
    trainable = [p for p in model.parameters() if p.requires_grad]
    decay = [p for p in trainable if decays(tuple(p.shape))]
    no_decay = [p for p in trainable if not decays(tuple(p.shape))]
    return [{"params": decay, "weight_decay": weight_decay},
            {"params": no_decay, "weight_decay": 0.0}]


def directory_parameters(path: str):
    """(parameter entries, stage-3 blocks) of a local Hugging Face model, from its config alone
    (`meta_model`), blocks found as nano finds them (`stage3_units.fetch_modules`). Presets need
    none of this: `model_shapes.preset_parameters`."""
    from zero_lab.nano.policies.stage3_units import fetch_modules, parameter_entries

    model = meta_model(path)
    blocks = fetch_modules(model)
    trainable = {parameter for parameter in model.parameters() if parameter.requires_grad}
    return [entry for entry, _ in parameter_entries(model, blocks, trainable)], [name for name, _, _ in blocks]
