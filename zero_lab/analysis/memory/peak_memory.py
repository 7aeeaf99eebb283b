"""The peak bytes one rank holds during a training step, predicted: model states from nano's formula,
activations from `activation_memory`, and the temporaries between them.

A step's moments, each with what is alive on the rank (nano's moments, `memory_formula.MOMENTS`):
    turn:            the forward is done and the backward starts: model states at nano's "forward"
                     moment (no gradients yet; at stage 3 the root unit, embeddings and head, is
                     gathered), every saved activation, the loss's temporaries, and from stage 2
                     the gradient bucket the head's gradient lands in (nano allocates a bucket at
                     its first gradient: the last `reduce_bucket_size` elements of the flat buffer
                     at stage 2, of the root unit at stage 3, in the communication dtype);
    recompute:       with gradient checkpointing, the first layer recomputed in the backward;
    first reduce:    nano at stage 2, when its first bucket fills (`first_reduce_bytes`); with tied
                     embeddings also the head's and the embedding's gradients summed (`tied_sum_bytes`);
    end of backward: model states at the "backward" moment (full gradients at stages 0/1, the
                     gradient partition from stage 2), activations gone;
    boundary:        nano at stages 0/1 packs `param.grad` into buckets after the backward: the
                     full gradients, the fp32 gradient partition and the first bucket at once (with
                     one partition, stage 0 or one rank, an fp32 bucket is a slice of the partition);
    optimizer step:  model states at the "step" moment (official at stages 1-2 adds its step's
                     gradient copies and its optimizer's temporaries: `official_step_bytes`).
Phase 1: count each moment's bytes. Phase 2: the peak is the largest, and its moment says why.

Parameters are counted per flat buffer: at stages 0-2 the whole model, as nano lays it out; at
stage 3 a unit per decoder layer and the root (the ZeRO-3 figures of `memory_formula` per unit), a
coarser cut than nano's (a unit per module's own parameters, as official fetches): the same bytes
but for each buffer's padding, and the same layers whole at the turn where the prefetch reaches
every layer (the harness's small models with the default prefetch).

Official DeepSpeed (0.19) holds more: at the turn of stages 1-2 (`official_turn_bytes`), at their step
(`official_step_bytes`), at stage 3 from its start (`official_stage3_bytes`); part of it is a buffer
only partly written on a small model (`untouched_staging`).

At stage 3 both impls gather by official's fetch rules (`zero_lab/nano/policies/fetch_policy.py`): the turn
holds the root and the layers those rules keep whole after the forward (`layers_whole_after_forward`,
from the run's `stage3_*` keys; the harness's small models with the default prefetch: every layer).

Each moment's bytes are split by place: the device's and the host's. Offload (`Offload`) moves the
optimizer's tensors (fp32 master and gradient partitions, Adam's states; official's fp32 partition
copies too) and, with `offload_param` at stage 3, the parameter partitions to the host; activations,
buckets and gathered parameters stay on the device. A meter on CPU sees both places (every tensor is
a CPU tensor), the caching allocator on CUDA only the device: `PeakPrediction.peak_seen_on` gives
the figure to set beside each, so an offload run on a GPU is not judged against the host's bytes.
"""

from __future__ import annotations


from zero_lab.analysis.memory.activation_memory import (ATTENTION_IMPLEMENTATIONS, FP32_BYTES,
                                                DecoderShape, activation_bytes, decoder_shape)
from zero_lab.analysis.memory.decoder_parameters import layer_parameter_sizes, matrix_parameters, unit_parameters
from zero_lab.analysis.memory.cuda.cached import cached_bytes
from zero_lab.analysis.memory.heap_kept import heap_kept_bytes
from zero_lab.analysis.memory.prediction import NO_OFFLOAD, PLACES, Offload, PeakPrediction, added, placed
from zero_lab.analysis.memory.stage2_reduce import first_reduce_bytes, tied_sum_bytes
from zero_lab.nano.dtypes import BYTES_OF_PRECISION
from zero_lab.nano.policies.fetch_policy import FetchRules, MicroStep, TracedUse, simulate_micro_step
from zero_lab.nano.memory.memory_formula import model_state_bytes, model_state_bytes_by_place

DEEPSPEED_FETCH_RULES = FetchRules(50_000_000, 1_000_000_000, 1_000_000_000)  # its stage3_* defaults


def decoder_micro_step(shape: DecoderShape, rules: FetchRules) -> MicroStep:
    """Stage 3: `fetch_policy`'s rules over the trace of a decoder (embedding, layers, final norm,
    head) in a steady step."""
    layer, root = unit_parameters(shape)
    head = shape.vocab_size * shape.hidden_size
    trace = ([TracedUse("model", None, 0), TracedUse("embedding", "root", head)]
             + [TracedUse(index, f"layer {index}", layer) for index in range(shape.layers)]
             + [TracedUse("norm", None, shape.hidden_size), TracedUse("head", "root", head)])
    numel = {f"layer {index}": layer for index in range(shape.layers)} | {"root": root}
    return simulate_micro_step(trace, numel, rules, held="root")


def layers_whole_after_forward(shape: DecoderShape, rules: FetchRules) -> int:
    """Stage 3: the decoder layers whole when the backward starts."""
    return len(decoder_micro_step(shape, rules).whole_after_forward - {"root"})


def model_states_by_place_at(moment: str, stage: int, precision: str, world_size: int, shape: DecoderShape,
                             rules: FetchRules = DEEPSPEED_FETCH_RULES, offload: Offload = NO_OFFLOAD) -> dict[str, int]:
    """Model-state bytes per rank and place at one of nano's moments (at stage 3 the root, and the
    layers the fetch rules keep, gathered in the forward)."""
    layer, root = unit_parameters(shape)
    if stage != 3:
        figures = [model_state_bytes_by_place(stage, precision, shape.layers * layer + root, world_size, moment,
                                              **offload.flags())]
    else:
        in_forward = moment == "forward"
        whole = layers_whole_after_forward(shape, rules) if in_forward else 0
        figures = [model_state_bytes_by_place(3, precision, layer, world_size, moment, sharded=True,
                                              gathered=index < whole, **offload.flags())
                   for index in range(shape.layers)]
        figures.append(model_state_bytes_by_place(3, precision, root, world_size, moment, sharded=True,
                                                  gathered=in_forward, **offload.flags()))
    return {place: sum(sum(figure[place].values()) for figure in figures) for place in PLACES}


def model_states_at(moment: str, stage: int, precision: str, world_size: int, shape: DecoderShape,
                    rules: FetchRules = DEEPSPEED_FETCH_RULES, offload: Offload = NO_OFFLOAD) -> int:
    """`model_states_by_place_at`, both places together."""
    return sum(model_states_by_place_at(moment, stage, precision, world_size, shape, rules, offload).values())


def model_state_categories_at(moment: str, stage: int, precision: str, world_size: int, shape: DecoderShape,
                              rules: FetchRules = DEEPSPEED_FETCH_RULES) -> dict[str, int]:
    """Model-state bytes per rank and category (`memory_formula.CATEGORIES`) at one of nano's moments
    (at stage 3 the root, and the layers the fetch rules keep, gathered in the forward)."""
    layer, root = unit_parameters(shape)
    if stage != 3:
        return model_state_bytes(stage, precision, shape.layers * layer + root, world_size, moment)
    in_forward = moment == "forward"
    whole = layers_whole_after_forward(shape, rules) if in_forward else 0
    figures = [model_state_bytes(3, precision, layer, world_size, moment, sharded=True, gathered=index < whole)
               for index in range(shape.layers)]
    figures.append(model_state_bytes(3, precision, root, world_size, moment, sharded=True, gathered=in_forward))
    return {category: sum(figure[category] for figure in figures) for category in figures[0]}


def communication_buffer_bytes(shape: DecoderShape, stage: int, precision: str, impl: str,
                               reduce_bucket_size: int | None, communication_precision: str,
                               rules: FetchRules = DEEPSPEED_FETCH_RULES) -> int:
    """The communication buffers the prediction counts at the turn (the module docstring): nano's
    first gradient bucket; official's `reduce_bucket_size`-element staging buffer at stages 1-2,
    and at stage 3 its reduce bucket and the copy of its largest prefetch."""
    if impl == "nano":
        return first_bucket_bytes(shape, stage, reduce_bucket_size, communication_precision)
    if stage in (1, 2):
        return (reduce_bucket_size or 0) * (FP32_BYTES if stage == 1 else BYTES_OF_PRECISION[precision])
    if stage == 3:
        return ((reduce_bucket_size or 0) * BYTES_OF_PRECISION[communication_precision]
                + decoder_micro_step(shape, rules).largest_prefetch * BYTES_OF_PRECISION[precision])
    return 0


def first_bucket_bytes(shape: DecoderShape, stage: int, reduce_bucket_size: int | None, precision: str) -> int:
    """The gradient bucket alive from the backward's first gradient (stages 2 and 3; 0 otherwise)."""
    if stage < 2 or not reduce_bucket_size:
        return 0
    layer, root = unit_parameters(shape)
    flat_numel = root if stage == 3 else shape.layers * layer + root
    return min(reduce_bucket_size, flat_numel) * BYTES_OF_PRECISION[precision]


def boundary_bytes(shape: DecoderShape, stage: int, precision: str, world_size: int, reduce_bucket_size: int | None,
                   communication_precision: str, offload: Offload = NO_OFFLOAD) -> dict[str, int]:
    """nano's stages 0/1 at the optimizer step's first bucket, per place: full gradients, the
    gradient partition (with the optimizer's tensors), a bucket (on the device)."""
    layer, root = unit_parameters(shape)
    numel = shape.layers * layer + root
    partition = model_state_bytes(stage, precision, numel, world_size, "step")["gradient_partition"]
    # one partition on the device: the bucket is packed in place
    in_place = (stage == 0 or world_size == 1) and communication_precision == "fp32" and not offload.optimizer
    bucket = 0 if in_place else min(reduce_bucket_size or numel, numel) * BYTES_OF_PRECISION[communication_precision]
    return added(model_states_by_place_at("backward", stage, precision, world_size, shape, offload=offload),
                 placed(**{offload.optimizer_place: partition}), placed(device=bucket))


def official_turn_bytes(shape: DecoderShape, stage: int, precision: str, world_size: int,
                        reduce_bucket_size: int | None, offload: Offload = NO_OFFLOAD) -> dict[str, int]:
    """What official DeepSpeed holds at the turn beyond nano's model states, stages 1-2, per place: its fp32
    partition copy; on the device the staging buffer and the head's gradient (the first, whole until staged)."""
    if stage not in (1, 2):
        return placed()
    layer, root = unit_parameters(shape)
    master_copy = model_state_bytes(stage, "bf16", shape.layers * layer + root, world_size)["fp32_master_partition"] \
        if precision == "fp32" else 0
    staging = (reduce_bucket_size or 0) * (FP32_BYTES if stage == 1 else BYTES_OF_PRECISION[precision])
    head_gradient = shape.vocab_size * shape.hidden_size * BYTES_OF_PRECISION[precision]
    return added(placed(**{offload.optimizer_place: master_copy}), placed(device=staging + head_gradient))


def adam_temporaries(optimizer: str | None, device: str | None) -> int:
    """fp32 copies of a group's partition the update of the `[model]` line's `optimizer` holds at once:
    torch's AdamW per tensor (its CPU default) 2 (`exp_avg_sq.sqrt()`, then divided), multi-tensor (its
    CUDA default) 1 (`_foreach_sqrt`); fused updates and nano's (65,536 elements at a time) none."""
    if optimizer in ("torch.optim.AdamW", "torch.optim.Adam"):
        return 2 if device == "cpu" else 1
    return 0


def official_step_bytes(shape: DecoderShape, stage: int, precision: str, world_size: int, temporaries: int,
                        offload: Offload = NO_OFFLOAD) -> dict[str, int]:
    """What official DeepSpeed holds at its optimizer step beyond nano's model states, stages 1-2
    without offload (`stage_1_and_2.py` `step`): its gradient partition in the parameters' dtype,
    flattened and cast to fp32 (the cast in place of nano's fp32 partition), beside the larger of the
    flat copy before its cast (none in fp32) and the optimizer's temporaries (`adam_temporaries`); in
    fp32 training its fp32 partition copy. Measured on CPU (small, bf16, 1 and 2 ranks) and on a GPU."""
    if stage not in (1, 2) or offload.optimizer:
        return placed()
    layer, root = unit_parameters(shape)
    width = BYTES_OF_PRECISION[precision]
    partition = -(-(shape.layers * layer + root) // world_size)
    master_copy = partition * FP32_BYTES if precision == "fp32" else 0
    flat_copy = partition * width if width != FP32_BYTES else 0
    update = temporaries * -(-matrix_parameters(shape) // world_size) * FP32_BYTES
    return placed(device=partition * width + master_copy + max(flat_copy, update))


def official_stage3_bytes(shape: DecoderShape, precision: str, world_size: int, moment: str,
                          reduce_bucket_size: int | None, persistence_threshold: int,
                          communication_precision: str, rules: FetchRules,
                          offload: Offload = NO_OFFLOAD, temporaries: int = 0) -> dict[str, int]:
    """What official DeepSpeed's stage 3 (0.19, `stage3.py`) holds beyond nano's model states at a
    moment (a negative figure: less than nano):
    - from initialization on: its gradient partitions, in the parameters' dtype (nano's fp32 ones
      exist from the first gradient on); the reduce bucket, `reduce_bucket_size` elements in the
      communication dtype; in fp32 training an fp32 copy of the partition (nano's partition is its
      own master);
    - the persistent parameters whole, beside their partitions;
    - in the forward (`partition_parameters.py`, `AllGatherCoalescedHandle`): a prefetch lands in
      one flat buffer that every parameter is then copied out of; the buffer lives until the last
      of those parameters is used, near the end of the forward, so the turn holds the largest
      prefetch twice. On one rank nothing is gathered: every partition is its whole parameter and
      `param.data` is a view of it (`_no_gather_coalesced`), so neither the gathered layers nor the
      prefetch copy are held;
    - at the step (`_prepare_fp32_grad_for_sub_group`): the gradient partitions flattened and cast
      to fp32, as at stages 1-2 (`official_step_bytes`).
    Measured on CPU (tiny and small, fp32 and bf16, 1 and 2 ranks) and on a GPU. The gradient partitions
    and fp32 copies are the optimizer's (on the host with `offload_optimizer`), the rest the device's."""
    layer, root = unit_parameters(shape)
    width = BYTES_OF_PRECISION[precision]
    partition = -(-(shape.layers * layer + root) // world_size)
    nano = model_state_categories_at(moment, 3, precision, world_size, shape, rules)
    persistent = (shape.layers * sum(size for size in layer_parameter_sizes(shape) if size <= persistence_threshold)
                  + (shape.hidden_size if shape.hidden_size <= persistence_threshold else 0))
    optimizers = partition * width - nano["gradient_partition"] + (partition * FP32_BYTES if precision == "fp32" else 0)
    if moment == "step":
        update = temporaries * -(-matrix_parameters(shape) // world_size) * FP32_BYTES
        optimizers += partition * FP32_BYTES + max(partition * width if width != FP32_BYTES else 0, update)
    on_device = (reduce_bucket_size or 0) * BYTES_OF_PRECISION[communication_precision]
    if world_size == 1:
        on_device -= nano["gathered_parameters"]
    else:
        prefetched = decoder_micro_step(shape, rules).largest_prefetch if moment == "forward" else 0
        on_device += persistent * width + prefetched * width
    return added(placed(**{offload.optimizer_place: optimizers}), placed(device=on_device))


def predict_peak(shape: DecoderShape, stage: int, precision: str, world_size: int, seq_len: int, micro_batch: int,
                 attention: str = "sdpa", gradient_checkpointing: bool = False,
                 accumulation: int = 1, reduce_bucket_size: int | None = None,
                 communication_precision: str | None = None, impl: str = "nano",
                 fetch_rules: FetchRules = DEEPSPEED_FETCH_RULES,
                 persistence_threshold: int = 100_000, offload: Offload = NO_OFFLOAD,
                 optimizer_temporaries: int = 0, device: str | None = None) -> PeakPrediction | None:
    """Phases 1-2 for one rank of a run, per place. With gradient accumulation the last
    micro-step's forward runs beside the gradients the earlier ones left (nano's "backward"
    moment). At stage 3 `fetch_rules` decide which layers are gathered at the turn (both impls
    follow official's rules). Activations and buckets are on the device; `device` "cpu": the ranks reduce
    through gloo (nano's emulated reduce-scatter holds more). FSDP2's: `fsdp2_peak` (None
    with offload). None for any other impl."""
    if impl == "fsdp2":
        from zero_lab.analysis.memory.fsdp2_peak import predict_fsdp2_peak  # built on this module's figures
        return None if offload != NO_OFFLOAD else predict_fsdp2_peak(
            shape, stage, precision, world_size, seq_len, micro_batch, attention, gradient_checkpointing,
            communication_precision)
    if impl not in ("nano", "official"):
        return None
    activations = activation_bytes(shape, seq_len, micro_batch, precision, attention, gradient_checkpointing)
    communication = communication_precision or precision

    def states(moment: str) -> dict[str, int]:
        held = model_states_by_place_at(moment, stage, precision, world_size, shape, fetch_rules, offload)
        if impl == "official" and stage == 3:
            held = added(held, official_stage3_bytes(shape, precision, world_size, moment, reduce_bucket_size,
                                                     persistence_threshold, communication, fetch_rules, offload,
                                                     optimizer_temporaries))
        return held

    turn = added(states("forward" if accumulation == 1 else "backward"), placed(device=activations.saved))
    bucket = first_bucket_bytes(shape, stage, reduce_bucket_size, communication) if impl == "nano" else 0
    if impl == "nano":
        turn = added(turn, placed(device=bucket))
    else:
        turn = added(turn, official_turn_bytes(shape, stage, precision, world_size, reduce_bucket_size, offload))
    step = states("step")
    if impl == "official":
        step = added(step, official_step_bytes(shape, stage, precision, world_size, optimizer_temporaries, offload))
    # a tied head's gradient waits for the embedding's: nano's first bucket comes after the loss's temporaries
    loss = max(activations.loss_transient - bucket, 0) if shape.tied_embeddings else activations.loss_transient
    places = {"turn": added(turn, placed(device=loss)),
              "end_of_backward": states("backward"),
              "optimizer_step": step}
    if gradient_checkpointing:
        places["recompute"] = added(turn, placed(device=activations.recompute))
    if impl == "nano" and stage == 2 and accumulation == 1 and reduce_bucket_size:
        places["first_reduce"] = added(states("forward"), first_reduce_bytes(
            shape, precision, world_size, reduce_bucket_size, communication, activations, device == "cpu", offload))
        if shape.tied_embeddings:
            places["tied_sum"] = added(states("forward"), tied_sum_bytes(shape, precision, world_size,
                                                                         reduce_bucket_size, communication, offload))
    if impl == "nano" and stage in (0, 1):
        places["boundary"] = boundary_bytes(shape, stage, precision, world_size, reduce_bucket_size, communication,
                                            offload)
    untouched = untouched_staging(shape, stage, precision, impl, reduce_bucket_size, communication)
    device_moment = max(places, key=lambda moment: places[moment]["device"])
    return PeakPrediction(places=places, activations=activations.saved, untouched=untouched,
                          untouched_at_initialize=untouched if stage == 3 else 0, heap_kept=heap_kept_bytes(
                              shape, precision, seq_len * micro_batch, activations, "module" if stage == 3 else None),
                          cached=cached_bytes(shape, stage, precision, world_size, impl, offload.optimizer,
                                              activations, device_moment))


def untouched_staging(shape: DecoderShape, stage: int, precision: str, impl: str, reduce_bucket_size: int | None,
                      communication_precision: str) -> int:
    """The part of official's `reduce_bucket_size`-element buffer, allocated empty, that the gradients never
    reach: a model smaller than the buffer writes only its own elements. Stages 1-2: its staging buffer,
    allocated at the first reduce; stage 3: its reduce bucket, allocated when the engine is built."""
    if impl != "official" or stage == 0 or not reduce_bucket_size:
        return 0
    layer, root = unit_parameters(shape)
    width = FP32_BYTES if stage == 1 else BYTES_OF_PRECISION[precision if stage == 2 else communication_precision]
    return max(0, reduce_bucket_size - (shape.layers * layer + root)) * width


def predict_run_peak(model: dict, zero: dict, stage: int, precision: str, world_size: int) -> PeakPrediction | None:
    """The prediction for a run of the impl its `[zero]` line names, from its `[model]` and `[zero]`
    lines (docs/log-format.md), its offload too; None when the model's architecture cannot be read
    here, the lines lack a figure, or the impl has no prediction."""
    try:
        shape = decoder_shape(str(model.get("name")))
    except ValueError:
        return None
    seq_len, micro_batch = model.get("seq_len"), model.get("micro_batch")
    if shape is None or not isinstance(seq_len, int) or not isinstance(micro_batch, int):
        return None
    attention = model.get("attn_impl") if model.get("attn_impl") in ATTENTION_IMPLEMENTATIONS else "sdpa"
    communication = zero.get("communication_data_type")  # "auto": the parameters' dtype
    bucket = zero.get("reduce_bucket_size")

    def stage3_key(key: str, default: int) -> int:
        value = zero.get(f"stage3_{key}")
        return value if isinstance(value, int) and not isinstance(value, bool) else default

    rules = FetchRules(stage3_key("prefetch_bucket_size", DEEPSPEED_FETCH_RULES.prefetch_bucket_size),
                       stage3_key("max_live_parameters", DEEPSPEED_FETCH_RULES.max_live_parameters),
                       stage3_key("max_reuse_distance", DEEPSPEED_FETCH_RULES.max_reuse_distance))
    return predict_peak(shape, stage, precision, world_size, seq_len, micro_batch, attention,
                        model.get("gradient_checkpointing") is True, int(zero.get("gradient_accumulation_steps") or 1),
                        bucket if isinstance(bucket, int) else None,
                        communication if communication in BYTES_OF_PRECISION else None, str(zero.get("impl", "nano")),
                        rules, stage3_key("param_persistence_threshold", 100_000),
                        Offload(zero.get("offload_optimizer") == "cpu", zero.get("offload_param") == "cpu"),
                        adam_temporaries(model.get("optimizer"), model.get("device")), model.get("device"))


def error_percent(predicted: float | None, measured: float | None) -> float | None:
    """(predicted - measured) / measured, in percent; None when either is missing or measured is 0."""
    if predicted is None or not measured:
        return None
    return 100.0 * (predicted - measured) / measured
