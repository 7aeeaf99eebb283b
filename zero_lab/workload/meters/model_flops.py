"""The work one trained token costs, counted as torchtitan counts it for model FLOPs utilisation (MFU).

A training step does, per token and per weight that multiplies an activation, one multiply and
one add in the forward (2 FLOPs) and twice that in the backward (the gradient of the input and of
the weight: 4 FLOPs): 6 FLOPs. Attention adds the two sequence-long matmuls (scores, then scores
times values), 2 in the forward and 4 in the backward, each of 2 FLOPs per element:

    flops_per_token = 6 * matmul_weights + 12 * layers * heads * head_dim * seq_len

matmul_weights is every parameter except the input embedding (a lookup, no multiply); an output
head tied to the embedding is counted, because its matmul runs even though its weight is shared.
Like torchtitan, the count ignores the causal mask's skipped half and any recomputation
(gradient checkpointing): it is the model's work, not the hardware's.
"""

from __future__ import annotations

import math
import platform
from pathlib import Path

import torch


def matmul_weights(module: torch.nn.Module) -> int:
    """Parameters that multiply activations: all, less the input embedding, plus a tied output head
    (counted with `ds_numel` where official stage 3 left a parameter empty)."""
    def elements(parameter: torch.nn.Parameter) -> int:
        return getattr(parameter, "ds_numel", parameter.numel())

    total = sum(elements(parameter) for parameter in module.parameters())
    input_embedding = getattr(module, "get_input_embeddings", lambda: None)()
    output_head = getattr(module, "get_output_embeddings", lambda: None)()
    embedding = input_embedding.weight if input_embedding is not None else None
    head = output_head.weight if output_head is not None else None
    if embedding is None:
        return total
    tied = head is not None and head is embedding
    return total - elements(embedding) + (elements(head) if tied else 0)


def attention_shape(config) -> tuple[int, int, int] | None:
    """(layers, heads, head_dim) from a Hugging Face config; None where the config does not say."""
    layers = getattr(config, "num_hidden_layers", None)
    heads = getattr(config, "num_attention_heads", None)
    head_dim = getattr(config, "head_dim", None)
    if head_dim is None and heads and getattr(config, "hidden_size", None):
        head_dim = config.hidden_size // heads
    if not (layers and heads and head_dim):
        return None
    return int(layers), int(heads), int(head_dim)


def flops_per_token(module: torch.nn.Module, seq_len: int) -> float:
    """The module's training FLOPs per token at this sequence length; NaN for a model whose
    attention shape its config does not give (no Hugging Face config)."""
    shape = attention_shape(getattr(module, "config", None))
    if shape is None:
        return math.nan
    layers, heads, head_dim = shape
    return float(6 * matmul_weights(module) + 12 * layers * heads * head_dim * seq_len)


def device_name(device: torch.device) -> str:
    """The accelerator's marketing name (`torch.cuda.get_device_name`), or the CPU's model name,
    with spaces as underscores: the log contract's values carry none."""
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
    else:
        name = cpu_model_name() or platform.machine() or "cpu"
    return "_".join(name.split())


def cpu_model_name() -> str | None:
    """The first `model name` of /proc/cpuinfo (Linux); None elsewhere."""
    try:
        for line in Path("/proc/cpuinfo").read_text(errors="replace").splitlines():
            if line.startswith("model name"):
                return line.partition(":")[2].strip()
    except OSError:
        pass
    return None
