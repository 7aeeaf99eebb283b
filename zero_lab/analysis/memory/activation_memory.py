"""Activation bytes of one micro-batch through a decoder as Hugging Face builds it (Qwen3, Llama):
the tensors autograd saves in the forward for the backward, and the loss's temporaries.

Model states (parameters, gradients, optimizer states) are nano's `memory/memory_formula.py`'s; this module
counts what the forward adds on top of them. Per token and layer, with w the parameters' bytes per
element (4 in fp32, 2 in bf16/fp16), h the hidden size, i the MLP's, a and k the query and
key/value heads, d the head size (every RMSNorm computes in fp32 and saves its fp32 input, its
normalized value and its output, the 16-bit ones as w):

| what is saved                         | bytes per token and layer          |
|---------------------------------------|------------------------------------|
| two RMSNorms (attention, MLP)         | 2 (4 + 2w) h                       |
| q_norm, k_norm (Qwen3 only)           | (4 + w) (a + k) d                  |
| rotated q and k, v                    | w (a + 2k) d                       |
| attention: sdpa, flash                | 4a (log-sum-exp) + w a d (output, o_proj's input) |
| attention: eager                      | w (a - k) 2d (k, v repeated to a heads) + (4 [+ w]) a s (softmax, [its 16-bit cast]) + w a d |
| MLP: gate, SiLU, up, their product    | 4 w i                              |
| RMSNorm scales                        | 4 (2 [+ a + k])                    |

Once per micro-batch: the final RMSNorm (4 + 2w) h + 4 and the loss's fp32 log-softmax 4V per token
(V the vocabulary; the logits are cast to fp32 first), the rotary tables 2 s d w, the batch itself
(input ids, attention mask, labels: 3 x 8 bytes per token; the embedding saves the ids it was
given) and the loss's shifted labels (8). With gradient checkpointing a layer keeps only its input, w h per
token, and recomputes its activations during its backward.

The largest temporary comes at the turn from forward to backward: the log-softmax's backward holds
its saved output, its incoming gradient and its outgoing gradient, 2 x 4V per token beyond what is
saved.

Phase 1: `decoder_shape` reads the architecture of a preset or of a local config.json (no torch).
Phase 2: `activation_bytes` counts the saved bytes and the temporaries for a micro-batch.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from zero_lab.nano.dtypes import BYTES_OF_PRECISION

FP32_BYTES = 4
INDEX_BYTES = 8  # int64 token ids, masks and labels
FAMILIES = ("qwen3", "llama")  # Hugging Face model_type values this model describes
ATTENTION_IMPLEMENTATIONS = ("sdpa", "eager", "flash_attention_2")


@dataclass(frozen=True)
class DecoderShape:
    """The numbers of a decoder architecture that activation memory depends on."""

    family: str  # "qwen3" normalizes q and k per head (q_norm, k_norm); "llama" does not
    hidden_size: int
    intermediate_size: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab_size: int
    tied_embeddings: bool = False  # one matrix for the token embeddings and the head


@dataclass(frozen=True)
class ActivationBytes:
    """One micro-batch's activation memory on one rank, in bytes."""

    saved: int  # alive from the end of the forward until the backward frees it
    loss_transient: int  # beyond `saved`, at the turn from forward to backward
    recompute: int  # beyond `saved`, during the backward with gradient checkpointing: one layer again
    per_layer: int  # saved per layer (all of it without checkpointing)


def shape_from_config(config: dict) -> DecoderShape | None:
    """A Hugging Face config (or a preset's numbers, which are Qwen3's) as a DecoderShape; None when
    its model_type is not one of FAMILIES."""
    family = config.get("model_type", "qwen3")
    if family not in FAMILIES:
        return None
    heads = int(config["num_attention_heads"])
    return DecoderShape(family=family, hidden_size=int(config["hidden_size"]),
                        intermediate_size=int(config["intermediate_size"]),
                        layers=int(config["num_hidden_layers"]), heads=heads,
                        kv_heads=int(config.get("num_key_value_heads") or heads),
                        head_dim=int(config.get("head_dim") or int(config["hidden_size"]) // heads),
                        vocab_size=int(config["vocab_size"]),
                        tied_embeddings=bool(config.get("tie_word_embeddings", False)))


def decoder_shape(model: str) -> DecoderShape | None:
    """Phase 1: a preset's shape, or a local model's from its config.json (the file or its directory's); None when the model
    is not a decoder this module describes. Raises ValueError for a directory it cannot read."""
    from zero_lab.workload.model_shapes import PRESETS, config_path

    if model in PRESETS:
        return shape_from_config(PRESETS[model])
    path = config_path(model) or Path(model).expanduser() / "config.json"
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"cannot read {path}: {error}") from None
    try:
        return shape_from_config(config)
    except (KeyError, TypeError, ValueError) as error:
        raise ValueError(f"{path} does not describe a decoder ({error!r} missing or malformed)") from None


def layer_bytes_per_token(shape: DecoderShape, width: int, seq_len: int, attention: str) -> int:
    """Bytes one layer saves per token (the module's table)."""
    h, i, a, k, d = shape.hidden_size, shape.intermediate_size, shape.heads, shape.kv_heads, shape.head_dim
    per_head_norms = shape.family == "qwen3"
    norms = 2 * (FP32_BYTES + 2 * width) * h
    norm_scales = FP32_BYTES * (2 + (a + k if per_head_norms else 0))
    query_key_norms = (FP32_BYTES + width) * (a + k) * d if per_head_norms else 0
    rotated_and_values = width * (a + 2 * k) * d
    if attention == "eager":
        repeated = width * (a - k) * 2 * d
        softmax = (FP32_BYTES + (width if width != FP32_BYTES else 0)) * a * seq_len
        core = repeated + softmax + width * a * d
    else:
        core = FP32_BYTES * a + width * a * d
    mlp = 4 * width * i
    return norms + norm_scales + query_key_norms + rotated_and_values + core + mlp


def activation_bytes(shape: DecoderShape, seq_len: int, micro_batch: int, precision: str,
                     attention: str = "sdpa", gradient_checkpointing: bool = False) -> ActivationBytes:
    """Phase 2: the activation memory of one micro-batch of `micro_batch` x `seq_len` tokens."""
    if attention not in ATTENTION_IMPLEMENTATIONS:
        raise ValueError(f"attention must be one of {ATTENTION_IMPLEMENTATIONS}, not {attention!r}")
    width = BYTES_OF_PRECISION[precision]
    tokens = seq_len * micro_batch
    full_layer = layer_bytes_per_token(shape, width, seq_len, attention) * tokens
    kept_layer = width * shape.hidden_size * tokens if gradient_checkpointing else full_layer
    head = ((FP32_BYTES + 2 * width) * shape.hidden_size + FP32_BYTES + FP32_BYTES * shape.vocab_size) * tokens
    once = 2 * seq_len * shape.head_dim * width + 4 * INDEX_BYTES * tokens
    return ActivationBytes(saved=shape.layers * kept_layer + head + once,
                           loss_transient=2 * FP32_BYTES * shape.vocab_size * tokens,
                           recompute=full_layer if gradient_checkpointing else 0,
                           per_layer=kept_layer)
