"""nano's stage 2 between the turn and the end of its backward: the moments where its gradient reduction,
not the activations, sets the peak (`peak_memory` adds them to its model states at the turn).

Measured on CPU (small, fp32 and bf16, 1 and 2 ranks, 64 tokens a sample; qwen3-0.6b in bf16 on one rank with
4 and 28 layers) with the storage tracker, each peak named by the frame that allocated it.
"""

from __future__ import annotations

from zero_lab.analysis.memory.activation_memory import FP32_BYTES, ActivationBytes, DecoderShape
from zero_lab.analysis.memory.decoder_parameters import matrix_parameters
from zero_lab.analysis.memory.prediction import NO_OFFLOAD, Offload, added, placed
from zero_lab.nano.dtypes import BYTES_OF_PRECISION


def first_reduce_bytes(shape: DecoderShape, precision: str, world_size: int, reduce_bucket_size: int,
                       communication_precision: str, activations: ActivationBytes, gloo: bool,
                       offload: Offload = NO_OFFLOAD) -> dict[str, int]:
    """nano at stage 2 when its first bucket is reduced, per place, beyond its model states at the turn: the
    matrices' flat buffer (the largest parameter group) fills its last `reduce_bucket_size` elements first;
    then rank 0's fp32 gradient partition of it is allocated, its share of the bucket lands there (through
    a copy unless the bucket is fp32), and gloo's emulated reduce-scatter receives N shares. Alive still:
    the bucket, the layers' activations the backward has not reached, and a tied head's gradient (its
    weight accumulates once, after the embedding's backward)."""
    matrices = matrix_parameters(shape)
    bucket = min(reduce_bucket_size, matrices)
    width = BYTES_OF_PRECISION[communication_precision]
    partition = -(-matrices // world_size)
    start = matrices - bucket  # the bucket's first element; its layer is the last the bucket waits for
    embedding = shape.vocab_size * shape.hidden_size
    layer_matrices = (matrices - embedding * (1 if shape.tied_embeddings else 2)) // shape.layers
    waiting = max(0, min(shape.layers, (start - embedding) // layer_matrices)) if layer_matrices else 0
    own = max(0, min(partition, matrices) - start)  # rank 0's share of the bucket
    copied = own * width if width != FP32_BYTES else 0
    received = own * world_size * width if gloo and world_size > 1 else 0
    head = BYTES_OF_PRECISION[precision] * embedding if shape.tied_embeddings else 0
    return added(placed(**{offload.optimizer_place: partition * FP32_BYTES}),
                 placed(device=bucket * width + copied + received + waiting * activations.per_layer + head))


def tied_sum_bytes(shape: DecoderShape, precision: str, world_size: int, reduce_bucket_size: int,
                   communication_precision: str, offload: Offload = NO_OFFLOAD) -> dict[str, int]:
    """nano at stage 2 with tied embeddings, at the embedding's backward, beyond its model states at the turn:
    autograd adds the head's gradient, held since the backward began, to the embedding's into a third
    tensor of the weight's size, beside the bucket the layers' last gradients fill and, once a bucket
    was reduced, the fp32 gradient partition."""
    if not shape.tied_embeddings:
        return placed()
    matrices = matrix_parameters(shape)
    weight_numel = shape.vocab_size * shape.hidden_size
    # the partition exists if a bucket was reduced before: one that ends before the embedding's weight starts
    partition = -(-matrices // world_size) if matrices - reduce_bucket_size >= weight_numel else 0
    bucket = min(reduce_bucket_size, matrices) * BYTES_OF_PRECISION[communication_precision]
    weight = BYTES_OF_PRECISION[precision] * weight_numel
    return added(placed(**{offload.optimizer_place: partition * FP32_BYTES}), placed(device=3 * weight + bucket))
