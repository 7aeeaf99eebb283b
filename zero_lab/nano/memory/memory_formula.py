"""Bytes each rank holds for model states, per ZeRO stage and precision: nano's documented formula.

The engine's tests measure the tensors nano really holds and compare them with this table, and
`zero-lab estimate` prints it beside the ZeRO paper's figures and official DeepSpeed's estimators.

Phase 1: lay the flat buffer out as the engine does (`layout.FlatLayout`): padded as official
         DeepSpeed pads, split into `world_size` partitions (stage 0 keeps one: the whole buffer).
         Partitions may cut through parameters, so only the buffer's total matters.
Phase 2: count every buffer of the vocabulary in `zero_lab.nano` at its dtype width.
A model has one flat buffer per unit and parameter group (`units.py`, `stage3_units.py`): at stages 0-2 one per
group; at stage 3 one per block, the root and the persistent parameters, per group. Sum the
buffers' figures; at stage 3 say which buffers are sharded between uses and which are gathered.
"""

from __future__ import annotations

from zero_lab.nano import stages
from zero_lab.nano.dtypes import BYTES_OF_PRECISION
from zero_lab.nano.layout import FlatLayout

FP32_BYTES = 4
ADAM_STATE_COUNT = 2  # exp_avg and exp_avg_sq, both fp32

CATEGORIES = (
    "parameters",
    "gathered_parameters",
    "gradients",
    "fp32_master_partition",
    "optimizer_states",
    "gradient_partition",
    "communication_buckets",
)


MOMENTS = ("forward", "backward", "step", "between_steps")


def model_state_bytes_by_place(stage: int, precision: str, numel: int, world_size: int, moment: str = "step",
                               sharded: bool = False, gathered: bool = False, offload_optimizer: bool = False,
                               offload_parameters: bool = False, grad_accum_dtype: str | None = None,
                               hpz_partition_size: int = 1, momentum_numel: int | None = None) -> dict[str, dict[str, int]]:
    """Bytes per rank of one flat buffer at one moment, per place ("device", "host") and category:

    forward:       inside the first micro-step's forward: no gradient buffer yet.
    backward:      the window's backward is done. Stages 0/1 hold full-size `param.grad`
                   (the parameters' dtype); stages 2/3 hold their fp32 gradient partition instead;
                   stage 1 with bf16 and `grad_accum_dtype` fp32 (the stage table's fp32-accumulation
                   variant) holds full-size fp32 gradients, padded (its gradient partition is a view
                   of them, no bytes of its own), and has released `param.grad`.
    step:          Adam is running: every stage holds its fp32 gradient partition (full at stage 0)
                   and has released `param.grad`; the fp32-accumulation variant its fp32 gradients.
    between_steps: every gradient buffer is released; parameters, masters and states remain.
    fp32 needs no master copy: the partition is the master, unless the optimizer is offloaded (the
    master then lives on the host, the partition on the device). At stage 3 a `sharded` buffer
    keeps only its partition between uses (on the host with `offload_parameters`), and its whole
    buffer while `gathered` (the caller knows which units are gathered at the moment; none are at
    the end of backward, in the step and between steps); a buffer that is not sharded (persistent
    parameters) counts as at stage 2. With `offload_optimizer` the master, the optimizer states and
    the gradient partition live on the host. Communication buckets are excluded: they live only
    while a bucket is being reduced. With hpZ (`hpz_partition_size` K > 1) a sharded buffer also
    holds its secondary partition, padded / K elements on the device, from its first gather to the
    end of the step (dropped after Adam: none between steps); it counts with the parameters.
    A Muon buffer (`momentum_numel` given: the elements of the matrices the rank's partition touches,
    `nano.muon.memory`) holds Muon's fp32 momentum of those elements instead of Adam's two states.
    """
    facts = stages.for_run(stage, precision, grad_accum_dtype, offload_optimizer)  # ValueError: not run by nano
    if precision not in BYTES_OF_PRECISION:
        raise ValueError(f"precision must be one of {sorted(BYTES_OF_PRECISION)}, not {precision!r}")
    if moment not in MOMENTS:
        raise ValueError(f"moment must be one of {MOMENTS}, not {moment!r}")
    width = BYTES_OF_PRECISION[precision]
    layout = FlatLayout.for_stage((numel,), stage, precision, world_size)  # Phase 1
    padded, partition = layout.padded_numel, layout.partition_numel
    in_window = moment in ("backward", "step")
    holds_fp32_gradients = in_window and facts.holds_fp32_gradients
    holds_full_gradients = moment == "backward" and not facts.reduces_during_backward and not holds_fp32_gradients
    holds_gradient_partition = (moment == "step" or (moment == "backward" and facts.reduces_during_backward)) \
        and not facts.holds_fp32_gradients
    sharded = sharded and facts.partitions_parameters
    optimizer_place = "host" if offload_optimizer else "device"
    parameter_place = "host" if sharded and offload_parameters else "device"
    has_master = precision != "fp32" or optimizer_place != parameter_place
    figures = {place: dict.fromkeys(CATEGORIES, 0) for place in ("device", "host")}  # Phase 2
    figures[parameter_place]["parameters"] = (partition if sharded else padded) * width
    if sharded and hpz_partition_size > 1 and moment != "between_steps":
        figures["device"]["parameters"] += padded // min(hpz_partition_size, world_size) * width
    figures["device"]["gathered_parameters"] = padded * width if sharded and gathered else 0
    figures["device"]["gradients"] = (numel * width if holds_full_gradients else
                                      padded * FP32_BYTES if holds_fp32_gradients else 0)
    figures[optimizer_place]["fp32_master_partition"] = partition * FP32_BYTES if has_master else 0
    figures[optimizer_place]["optimizer_states"] = (partition * FP32_BYTES * ADAM_STATE_COUNT if momentum_numel is None
                                                    else momentum_numel * FP32_BYTES)
    figures[optimizer_place]["gradient_partition"] = partition * FP32_BYTES if holds_gradient_partition else 0
    return figures


def model_state_bytes(stage: int, precision: str, numel: int, world_size: int, moment: str = "step",
                      sharded: bool = False, gathered: bool = False, offload_optimizer: bool = False,
                      offload_parameters: bool = False, grad_accum_dtype: str | None = None,
                      hpz_partition_size: int = 1) -> dict[str, int]:
    """`model_state_bytes_by_place`'s figures, device and host added together."""
    places = model_state_bytes_by_place(stage, precision, numel, world_size, moment, sharded, gathered,
                                        offload_optimizer, offload_parameters, grad_accum_dtype,
                                        hpz_partition_size)
    return {category: places["device"][category] + places["host"][category] for category in CATEGORIES}


def total(figures: list[dict[str, int]]) -> dict[str, int]:
    """Category by category, the sum of several buffers' figures."""
    return {category: sum(figure[category] for figure in figures) for category in CATEGORIES}


def peak_model_state_bytes_by_place(stage: int, precision: str, numel: int, world_size: int,
                                    stage3_buffers: list[tuple[int, str]] | None = None,
                                    offload_optimizer: bool = False, offload_parameters: bool = False,
                                    grad_accum_dtype: str | None = None,
                                    hpz_partition_size: int = 1, momentum_numels: list | None = None) -> dict[str, int]:
    """What a rank must fit besides activations, per place: {"device": bytes, "host": bytes}, each
    the larger of the backward and step moments (the two places may peak at different moments).
    In the fp32-accumulation variant the last backward's bf16 gradients coexist with the fp32
    gradients until they are added in, so that moment counts both.

    At stage 3, `stage3_buffers` lists the model's flat buffers as (elements, role), role being
    "persistent", "root" or "block" (`stage3_units.flat_buffer_roles`); the peak comes inside a backward,
    with every gradient partition allocated and the root and the largest block gathered. Without
    the list, stage 3 counts the whole model as one block gathered (an upper bound). With hpZ
    (`hpz_partition_size` > 1) every sharded buffer adds its secondary partition at both moments.
    With Muon, `momentum_numels` gives each buffer's momentum elements (None: an Adam buffer): one
    entry below stage 3 (the one buffer), one per entry of `stage3_buffers` at stage 3.
    """
    offload = {"offload_optimizer": offload_optimizer, "offload_parameters": offload_parameters}
    if not stages.of(stage).partitions_parameters:
        momentum = (momentum_numels or [None])[0]
        moments = [model_state_bytes_by_place(stage, precision, numel, world_size, moment,
                                              grad_accum_dtype=grad_accum_dtype, **offload, momentum_numel=momentum)
                   for moment in ("backward", "step")]
        if stages.for_run(stage, precision, grad_accum_dtype, offload_optimizer).holds_fp32_gradients:
            before_moving = {place: dict(figures) for place, figures in moments[0].items()}
            before_moving["device"]["gradients"] += numel * BYTES_OF_PRECISION[precision]
            moments.append(before_moving)
    else:
        buffers = stage3_buffers or [(numel, "block")]
        momentum = momentum_numels or [None] * len(buffers)
        largest = max((size for size, role in buffers if role == "block"), default=0)
        largest_index = next((index for index, (size, role) in enumerate(buffers)
                              if role == "block" and size == largest), None)
        inside_backward = [model_state_bytes_by_place(3, precision, size, world_size, "backward",
                                                      sharded=role != "persistent",
                                                      gathered=role == "root" or index == largest_index, **offload,
                                                      hpz_partition_size=hpz_partition_size,
                                                      momentum_numel=momentum[index])
                           for index, (size, role) in enumerate(buffers)]
        step = [model_state_bytes_by_place(3, precision, size, world_size, "step", sharded=role != "persistent",
                                           **offload, hpz_partition_size=hpz_partition_size,
                                           momentum_numel=momentum[index])
                for index, (size, role) in enumerate(buffers)]
        moments = [{place: total([figure[place] for figure in figures]) for place in ("device", "host")}
                   for figures in (inside_backward, step)]
    return {place: max(sum(moment[place].values()) for moment in moments) for place in ("device", "host")}


def peak_model_state_bytes(stage: int, precision: str, numel: int, world_size: int,
                           stage3_buffers: list[tuple[int, str]] | None = None,
                           grad_accum_dtype: str | None = None) -> int:
    """`peak_model_state_bytes_by_place` without offload: everything on the device."""
    return peak_model_state_bytes_by_place(stage, precision, numel, world_size, stage3_buffers,
                                           grad_accum_dtype=grad_accum_dtype)["device"]
