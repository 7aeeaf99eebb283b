"""The peak bytes one FSDP2 rank holds during a training step, predicted (zero_lab.fsdp2: `fully_shard` on
every decoder layer, then on the root, which takes the embeddings, the final norm and the head).

What FSDP2 (torch 2.13, `_fully_shard`) holds, per rank, with P parameters over W ranks:
    between steps:   its sharded parameters in fp32 and AdamW's two states (12 bytes x P / W; the fused
                     AdamW zero_lab.fsdp2 asks for makes no temporaries: `memory_formula`);
    unsharded:       a group's whole parameters in the compute dtype (2 bytes in bf16 through its
                     MixedPrecisionPolicy, else 4): every group from the forward to its backward at
                     stage 2 (`reshard_after_forward=False`), at stage 3 the group in use alone;
    a group's reduce (`foreach_reduce`, at its post-backward): its unsharded gradients are copied into
                     one reduce-scatter input in the reduce dtype and freed; the output, P_group / W
                     elements in the reduce dtype, is cast to an fp32 gradient shard when the reduce
                     dtype is narrower; the input is kept until the next group's reduce.
A step's moments, each with what is alive:
    turn:            the forward done, the loss computed: the model states between steps, the
                     unsharded parameters (stage 2: all of them; stage 3: the root's, gathered for the
                     head), the activations and the loss's temporaries (`activation_memory`);
    first layer's backward: the head's gradient (the root's, held until the root reduces, last) and the
                     last layer's unsharded gradients beside every activation, with the unsharded
                     parameters (stage 3: the root's, the layer's and the next layer's, prefetched);
    root reduce:     the end of the backward: the root group (embeddings and head) reduces last, when
                     every layer's fp32 gradient shard exists and the activations are gone: its
                     reduce-scatter input, its output, the fp32 cast, and the first layer's input still
                     kept;
    end of backward: every fp32 gradient shard beside the model states (also the step's: fused AdamW).
On CUDA the caching allocator keeps a pool per stream, and FSDP2 allocates on three (`cuda.cached.fsdp2_pools`):
its reduce-scatter stream makes each group's reduce output and its fp32 cast, the gradient shards, which live
until `zero_grad`; its all-gather stream each group's all-gather output, freed once copied out. So the
device reserves the default stream's peak, which comes when the shards are gone, beside both pools.
Measured (CPU, one rank, bf16, seq 512; the storage tracker): qwen3-0.6b at stage 2 peaks at the turn,
9,834.9 MB; at stage 3 at the root's reduce, 9,718.5 MB; one H200 measured 9,946.0 and 9,786.2 MB, the same
bytes plus about 66 MB of CUDA's own (cuBLAS workspaces) in every sample.
Not predicted (None): CPU offload (`CPUOffloadPolicy`), Muon, stages 0 and 1 (no FSDP2 equivalent).
"""

from __future__ import annotations

from zero_lab.analysis.memory.activation_memory import FP32_BYTES, DecoderShape, activation_bytes
from zero_lab.analysis.memory.cuda.cached import fsdp2_pools
from zero_lab.analysis.memory.decoder_parameters import unit_parameters
from zero_lab.analysis.memory.heap_kept import heap_kept_bytes
from zero_lab.analysis.memory.prediction import PeakPrediction, placed
from zero_lab.nano.dtypes import BYTES_OF_PRECISION

STATE_BYTES = 3 * FP32_BYTES  # the fp32 shard and AdamW's two states, per element of the shard


def shard(numel: int, world_size: int) -> int:
    """Elements of one rank's shard of a group (rounded up: rank 0 holds the largest)."""
    return -(-numel // world_size)


def predict_fsdp2_peak(shape: DecoderShape, stage: int, precision: str, world_size: int, seq_len: int,
                       micro_batch: int, attention: str = "sdpa", gradient_checkpointing: bool = False,
                       communication_precision: str | None = None) -> PeakPrediction | None:
    """The moments of the module docstring for one rank, all on the device; None for a stage FSDP2 does not
    run. communication_precision: the reduce dtype (zero_lab.fsdp2 reduces in the compute dtype unless the
    config's communication_data_type says otherwise)."""
    if stage not in (2, 3):
        return None
    layer, root = unit_parameters(shape)
    layers = shape.layers
    width = BYTES_OF_PRECISION[precision]
    reduce_width = BYTES_OF_PRECISION[communication_precision or precision]
    activations = activation_bytes(shape, seq_len, micro_batch, precision, attention, gradient_checkpointing)
    between = STATE_BYTES * (layers * shard(layer, world_size) + shard(root, world_size))
    gradient_shards = FP32_BYTES * (layers * shard(layer, world_size) + shard(root, world_size))
    unsharded = width * (layers * layer + root if stage == 2 else root)
    turn = between + unsharded + activations.saved + activations.loss_transient
    in_backward = unsharded + (2 * width * layer if stage == 3 else 0)  # stage 3: the layer and the next one
    first_layer = between + in_backward + activations.saved + width * root + width * layer
    cast = FP32_BYTES * shard(root, world_size) if reduce_width != FP32_BYTES else 0
    root_reduce = (between + FP32_BYTES * layers * shard(layer, world_size) + reduce_width * root
                   + reduce_width * shard(root, world_size) + cast + reduce_width * layer)
    places = {"turn": placed(device=turn), "first_layer_backward": placed(device=first_layer),
              "root_reduce": placed(device=root_reduce),
              "end_of_backward": placed(device=between + gradient_shards)}
    if gradient_checkpointing:
        places["recompute"] = placed(device=turn - activations.loss_transient + activations.recompute)
    peak = max(figures["device"] for figures in places.values())
    # the default stream's share of the root's reduce: its reduce-scatter input and the first layer's, kept
    default_stream = max(turn, first_layer, between + reduce_width * (root + layer),
                         places.get("recompute", {"device": 0})["device"])
    pools = fsdp2_pools([shard(root, world_size)] + [shard(layer, world_size)] * layers, reduce_width, width * root,
                        width * layer)
    return PeakPrediction(places=places, activations=activations.saved,
                          heap_kept=heap_kept_bytes(shape, precision, seq_len * micro_batch, activations, "layer"),
                          cached=default_stream + pools - peak)
