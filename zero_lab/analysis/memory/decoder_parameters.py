"""A decoder's parameters counted from its shape alone: a layer's, the root's (embeddings, final norm, head),
each parameter of a layer, and the matrices (the harness's decayed parameter group, the largest)."""

from __future__ import annotations

from zero_lab.analysis.memory.activation_memory import DecoderShape


def unit_parameters(shape: DecoderShape) -> tuple[int, int]:
    """(parameters of one decoder layer, parameters of the root: embeddings, final norm, head)."""
    h, i, a, k, d = shape.hidden_size, shape.intermediate_size, shape.heads, shape.kv_heads, shape.head_dim
    attention = h * a * d + 2 * h * k * d + a * d * h + (2 * d if shape.family == "qwen3" else 0)
    layer = attention + 3 * h * i + 2 * h
    root = shape.vocab_size * h * (1 if shape.tied_embeddings else 2) + h
    return layer, root


def layer_parameter_sizes(shape: DecoderShape) -> list[int]:
    """The elements of each parameter of one decoder layer."""
    h, i, a, k, d = shape.hidden_size, shape.intermediate_size, shape.heads, shape.kv_heads, shape.head_dim
    norms = [d, d] if shape.family == "qwen3" else []
    return [h * a * d, h * k * d, h * k * d, a * d * h, *norms, h * i, h * i, i * h, h, h]


def matrix_parameters(shape: DecoderShape) -> int:
    """The elements of the model's matrices: the largest parameter group (the harness's decayed one)."""
    return (shape.layers * sum(size for size in layer_parameter_sizes(shape) if size not in (shape.hidden_size,
            shape.head_dim)) + shape.vocab_size * shape.hidden_size * (1 if shape.tied_embeddings else 2))
