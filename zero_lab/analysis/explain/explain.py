"""One optimizer step of nano, phase by phase, for a model it never builds: what one rank holds and
what moves (`zero-lab explain`). Pure arithmetic: the bytes come from nano's own layout
(`layout.FlatLayout`: padding, partitions, buckets), its memory formula (`memory_formula`), its
stage-3 policies (`unit_policy`) and the wire-bytes convention (`workload.meters.wire_bytes`).

Phase 1 (buffers): the harness's weight-decay groups and, at stage 3, the unit policy cut the
         parameters into flat buffers, one per unit and group (as `units.split_groups_by_unit`),
         each laid out as the engine lays it out.
Phase 2 (moments): the memory formula for every buffer at each moment, summed by category.
Phase 3 (collectives), phase by phase, as the stage modules describe them:
    forward           stage 3: the root is gathered (held until the end of backward), then each
                      module's unit (its own parameters, as official fetches) as `fetch_policy`'s
                      rules over the trace say (`unit_policy.forward_trace`, from the parameter
                      table): at its use or ahead of it (prefetch), freed after it unless the
                      prefetch reached its backward use or `stage3_max_reuse_distance` keeps it;
                      one call per fetch and one per prefetch, whatever it starts (each buffer
                      by itself with hpZ or qwZ);
    backward          stage 3: each unit freed after its forward is gathered again; stages 2
                      and 3: every gradient bucket is reduce-scattered (all-reduced with
                      `reduce_scatter: false`; with qgZ over several nodes, four all-to-alls) as
                      its gradients arrive, in every micro-step; stage 3's persistent buffers
                      share one bucket (`nano.spanning_layout`), one call unless they exceed
                      `reduce_bucket_size`;
    reduce_gradients  stages 0 and 1, the step's first phase: every bucket is packed from
                      `param.grad` and reduced, once per optimizer step (stage 0 all-reduces);
    muon_gather       with Muon (`nano.muon`): each Muon buffer's fp32 gradient partitions are
                      all-gathered, one call per buffer (none with one partition); at stage 3 its
                      momentum partitions too, a second call;
    unscale_clip      stages 1-3: the squared gradient norm is summed over ranks (4 bytes);
    adam              nothing moves;
    all_gather        stages 1 and 2: each buffer is gathered whole again, in one call per buffer;
                      stage 3: its persistent buffers, all in one call (`nano.coalesced_gather`).
It describes a steady step (stage 3 records the order of uses during the first one). Ops are
collective families (`all_gather` for `all_gather_into_tensor` too); with one rank nothing moves.
Phase 4 (peak): a stage-3 call of several buffers holds a staging tensor of its size
(`nano.coalesced_gather`), and ZeRO++'s quantized collectives hold temporaries while they run (qwZ: int8 blocks
and scales, sent and received; qgZ: int4 rows, scales and fp32 rows; `nano.zeropp.quantization`'s
figures); the peak is the largest of each phase's moment plus the largest temporary of its collectives.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING
from zero_lab.nano import stages
from zero_lab.nano.dtypes import BYTES_OF_PRECISION
from zero_lab.nano.layout import FlatLayout
from zero_lab.nano.zeropp.quantization import (block_count, gradient_chunk, gradient_exchange_temporary_bytes,
                                        weight_gather_temporary_bytes)
from zero_lab.nano.memory.memory_formula import CATEGORIES, model_state_bytes_by_place
from zero_lab.nano.muon.groups import is_hidden_matrix, largest_first
from zero_lab.nano.muon.memory import gathers as muon_gathers, momentum_numel
from zero_lab.nano.spanning_layout import SpanningLayout, plan_buckets
from zero_lab.nano.policies.fetch_policy import FetchRules, MicroStep, simulate_micro_step
from zero_lab.nano.policies.unit_policy import ParameterEntry, UnitPlan, forward_trace, plan_units, traced_calls
from zero_lab.workload.model_shapes import PRESETS, decays, preset_module_calls
from zero_lab.workload.meters.wire_bytes import ranks_on_node, wire_split

if TYPE_CHECKING:  # the typed config loads pydantic; the walk-through only reads its fields
    from zero_lab.nano.config import NanoConfig

FP32_BYTES = 4
GROUP_NAMES = ("decay", "no_decay")  # the harness's parameter groups, in order

# Each moment, and the memory formula's moment it is.
MOMENTS = {"between_steps": "between_steps", "end_of_forward": "forward", "end_of_backward": "backward",
           "optimizer_step": "step"}

# Each phase: the engine call it runs in, the moment that describes what a rank holds after it,
# and one line of what happens.
PHASES = {
    "forward": ("engine(batch)", "end_of_forward", "the model's forward; stage 3 gathers each unit for its use"),
    "backward": ("engine.backward(loss)", "end_of_backward",
                 "gradients; stages 2-3 reduce each bucket as it fills, stage 3 gathers each freed unit again"),
    "reduce_gradients": ("engine.step()", "optimizer_step",
                         "stages 0-1: the buckets are packed from param.grad and reduced at the boundary"),
    "muon_gather": ("engine.step()", "optimizer_step",
                    "Muon: each Muon buffer's fp32 gradient gathered whole, its matrices orthogonalised"),
    "unscale_clip": ("engine.step()", "optimizer_step",
                     "unscale (fp16), the global gradient norm over ranks, clip"),
    "adam": ("engine.step()", "optimizer_step", "Adam on the fp32 master partitions"),
    "all_gather": ("engine.step()", "between_steps",
                   "the updated partitions become whole parameters again; gradient buffers released"),
}


@dataclass(frozen=True)
class Buffer:
    """One flat buffer: its unit, its parameter group and its layout."""

    unit: str
    group: str
    layout: FlatLayout
    sharded: bool
    muon: bool = False  # a Muon half's buffer (the config's optimizer is Muon: `nano.muon`)

    @property
    def name(self) -> str:
        return f"{self.unit}/{self.group}"


@dataclass(frozen=True)
class Collective:
    phase: str
    op: str
    payload_bytes: int
    wire_bytes: int
    what: str  # the buffer, bucket or unit it moves
    wire_intra_bytes: int = 0  # of wire_bytes, to ranks on this rank's node (rank 0's; nodes: ranks_per_node)
    wire_inter_bytes: int = 0  # of wire_bytes, to ranks on other nodes
    temporary_bytes: int = 0  # held while it runs, beside what it reads and fills (staging, ZeRO++'s quantized ones)


@dataclass
class Walkthrough:
    """One steady optimizer step of one rank."""

    model: str
    parameters: int
    stage: int
    world_size: int
    precision: str
    micro_steps: int
    buffers: list[Buffer]
    moments: dict[str, dict[str, dict[str, int]]]  # moment -> place -> category -> bytes
    collectives: list[Collective] = field(default_factory=list)
    ranks_per_node: int | None = None  # nodes of this many consecutive ranks (None: one node)

    def phases(self) -> list[str]:
        skipped = {"reduce_gradients"} if self.stage >= 2 else set()
        skipped |= set() if any(buffer.muon for buffer in self.buffers) else {"muon_gather"}
        return [phase for phase in PHASES if phase not in skipped]

    def moment_bytes(self, moment: str) -> dict[str, int]:
        places = self.moments[moment]
        return {category: places["device"][category] + places["host"][category] for category in CATEGORIES}

    def peak(self) -> dict:
        """Phase 4: the phase whose moment plus the largest temporary of its collectives is the most:
        {bytes, phase, moment, temporary_bytes, temporary_of} (model states and temporaries, no activations)."""
        found = []
        for phase in self.phases():
            moment = PHASES[phase][1]
            largest = max((item for item in self.collectives if item.phase == phase), default=None,
                          key=lambda item: item.temporary_bytes)
            temporary = largest.temporary_bytes if largest is not None else 0
            found.append({"bytes": sum(self.moment_bytes(moment).values()) + temporary, "phase": phase,
                          "moment": moment, "temporary_bytes": temporary,
                          "temporary_of": largest.what if temporary else None})
        return max(found, key=lambda item: item["bytes"])

    def to_json(self) -> dict:
        """The contract of `zero-lab explain --format json` (docs/explain-json.md)."""
        return {
            "model": self.model, "stage": self.stage, "world_size": self.world_size, "precision": self.precision,
            "micro_steps": self.micro_steps, "parameters": self.parameters,
            "buffers": [{"name": buffer.name, "numel": buffer.layout.numel, "padded_numel": buffer.layout.padded_numel,
                         "partition_numel": buffer.layout.partition_numel, "sharded": buffer.sharded}
                        for buffer in self.buffers],
            "moments": [{"name": name, "bytes": self.moment_bytes(name), "total_bytes": sum(self.moment_bytes(name).values()),
                         "device_bytes": sum(self.moments[name]["device"].values()),
                         "host_bytes": sum(self.moments[name]["host"].values())} for name in MOMENTS],
            "phases": [{"name": phase, "engine_call": PHASES[phase][0], "holds": PHASES[phase][1],
                        "summary": PHASES[phase][2]} for phase in self.phases()],
            "ranks_per_node": self.ranks_per_node,
            "collectives": [{"phase": item.phase, "op": item.op, "payload_bytes": item.payload_bytes,
                             "wire_bytes": item.wire_bytes, "wire_intra_bytes": item.wire_intra_bytes,
                             "wire_inter_bytes": item.wire_inter_bytes, "what": item.what,
                             "temporary_bytes": item.temporary_bytes}
                            for item in self.collectives],
            "peak": self.peak(),
        }


def flat_buffers(entries: list[ParameterEntry], blocks: list[str], config: NanoConfig,
                 world_size: int) -> list[Buffer]:
    """Phase 1: one buffer per unit and group, in the engine's order."""
    zero = config.zero_optimization
    if zero.stage < 3:
        units = [UnitPlan("model", tuple(range(len(entries))), False)]
    else:
        units = plan_units(entries, blocks, zero.stage3_param_persistence_threshold,
                           zero.stage3_model_persistence_threshold)
    buffers = []
    muon = config.optimizer is not None and config.optimizer.type == "Muon"
    for unit in units:
        for group in GROUP_NAMES:
            members = [index for index in unit.members if decays(entries[index].shape) == (group == "decay")]
            for half, chosen in (muon_halves(entries, members) if muon else [("", members)]):
                numels = tuple(entries[index].numel for index in chosen)
                if numels:
                    layout = FlatLayout.for_stage(numels, zero.stage, config.precision, world_size)
                    buffers.append(Buffer(unit.name, group + half, layout, unit.sharded, half == "-muon"))
    return buffers


def muon_halves(entries: list[ParameterEntry], members: list[int]) -> list[tuple[str, list[int]]]:
    """A group's Muon half (its hidden matrices, largest shape first) and its AdamW half, as
    `nano.muon.groups.split_groups` splits it."""
    hidden = [index for index in members if is_hidden_matrix(entries[index].name, entries[index].shape)]
    ordered = [hidden[position] for position in largest_first([entries[index].shape for index in hidden])]
    return [("-muon", ordered), ("-adam", [index for index in members if index not in hidden])]


def stage3_micro_step(model: str, entries: list[ParameterEntry], blocks: list[str], buffers: list[Buffer],
                      config: NanoConfig) -> MicroStep:
    """Stage 3's gathers in a steady micro-step: `fetch_policy`'s rules over the trace the engine
    records (a preset's module calls, `model_shapes.preset_module_calls`; for another model,
    `unit_policy.forward_trace` from its parameter table), the root held from the forward to the
    end of the backward."""
    zero = config.zero_optimization
    units = plan_units(entries, blocks, zero.stage3_param_persistence_threshold, zero.stage3_model_persistence_threshold)
    unit_numel: dict[str, int] = {}
    for buffer in buffers:
        if buffer.sharded:
            unit_numel[buffer.unit] = unit_numel.get(buffer.unit, 0) + buffer.layout.padded_numel
    rules = FetchRules(zero.stage3_prefetch_bucket_size, zero.stage3_max_live_parameters, zero.stage3_max_reuse_distance)
    held = "root" if "root" in unit_numel else None
    if model in PRESETS:
        forward, backward = preset_module_calls(model)
        return simulate_micro_step(traced_calls(forward, entries, units), unit_numel, rules, held,
                                   traced_calls(backward, entries, units))
    return simulate_micro_step(forward_trace(entries, blocks, units), unit_numel, rules, held)


def moments(buffers: list[Buffer], config: NanoConfig, world_size: int, whole_after_forward: set[str]) -> dict:
    """Phase 2: bytes per place and category at each moment. Nothing is gathered at the end of
    backward, in the step or between steps; at the end of forward the units the policy left whole are."""
    zero = config.zero_optimization
    partitioned = config.stage_facts.partitions_parameters  # where Muon keeps its momentum (`nano.muon.memory`)
    figures = {}
    for name, formula_moment in MOMENTS.items():
        total = {place: dict.fromkeys(CATEGORIES, 0) for place in ("device", "host")}
        for buffer in buffers:
            gathered = name == "end_of_forward" and buffer.sharded and buffer.unit in whole_after_forward
            places = model_state_bytes_by_place(zero.stage, config.precision, buffer.layout.numel, world_size,
                                                formula_moment, sharded=buffer.sharded, gathered=gathered,
                                                offload_optimizer=zero.offload_optimizer.device == "cpu",
                                                offload_parameters=zero.offload_param.device == "cpu",
                                                grad_accum_dtype=config.data_types.grad_accum_dtype,
                                                hpz_partition_size=zero.zero_hpz_partition_size,
                                                # Muon: the momentum of the matrices rank 0's partition touches
                                                momentum_numel=momentum_numel(buffer.layout, 0, partitioned)
                                                if buffer.muon else None)
            for place, categories in places.items():
                for category, nbytes in categories.items():
                    total[place][category] += nbytes
        figures[name] = total
    return figures


def collectives(buffers: list[Buffer], config: NanoConfig, world_size: int,
                micro_step: MicroStep | None, ranks_per_node: int | None = None) -> list[Collective]:
    """Phase 3: every collective of one steady optimizer step, phase by phase, each rank 0's wire
    bytes split into intra- and inter-node ones (`wire_bytes.wire_split`). With hpZ a unit's first
    gather of the step reads the primary partitions (the world); every later one, the secondary
    partitions of the node's `zero_hpz_partition_size` ranks (`nano.zeropp.hierarchical_partition`). With
    qwZ every such gather is two: the int8 values and the fp32 block scales (`nano.zeropp.quantized_weights`).
    With qgZ over more than one node, every bucket's reduce-scatter is four all-to-alls: int4 values and
    fp32 scales within the node, then the same across nodes (`nano.zeropp.quantized_gradients`)."""
    if world_size == 1:
        return []
    zero, stage = config.zero_optimization, config.zero_optimization.stage
    width = BYTES_OF_PRECISION[config.precision]
    communication_width = BYTES_OF_PRECISION[config.communication_data_type or config.precision]
    # stage 1's fp32-accumulation variant all-reduces its fp32 gradients whole, as official does
    scatters = stage >= 1 and zero.reduce_scatter and not config.stage_facts.holds_fp32_gradients
    reduction = "reduce_scatter" if scatters else "all_reduce"

    def moved(phase: str, op: str, payload: int, what: str, group_size: int = world_size,
              stride: int = 1, temporary: int = 0) -> Collective:
        """One call over the group of ranks 0, stride, 2 stride, ... (group_size of them)."""
        ranks = list(range(0, group_size * stride, stride))
        on_my_node = ranks_on_node(ranks, 0, ranks_per_node) if ranks_per_node else group_size
        intra, inter = wire_split(op, payload, group_size, on_my_node)
        return Collective(phase, op, payload, intra + inter, what, intra, inter, temporary)

    secondary_group = min(zero.zero_hpz_partition_size, world_size) if zero.hpz_enabled else 0
    with_secondary: set[str] = set()  # units gathered once this step: hpZ gathers them again in the node

    # qgZ (`nano.zeropp.quantized_gradients`) over more than one node of ranks_per_node ranks
    nodes = world_size // ranks_per_node if ranks_per_node and world_size % ranks_per_node == 0 else 1
    quantized_reduction = stage == 3 and zero.zero_quantized_gradients and scatters and nodes > 1

    def reductions(phase: str, chosen: list[Buffer]) -> list[Collective]:
        """Every gradient bucket's reduction: each buffer's range buckets, then the buckets spanning
        stage 3's persistent buffers (`nano.spanning_layout`), in the engine's order."""
        ranges, groups = plan_buckets([buffer.layout for buffer in chosen],
                                      [stages.of(stage).reduces_whole_buffer_together(buffer.sharded)
                                       for buffer in chosen], zero.reduce_bucket_size)
        buckets = []  # (what, payload elements, largest share)
        per_buffer, numbered = Counter(index for index, _, _ in ranges), Counter()
        for index, start, end in ranges:
            numbered[index] += 1
            buckets.append((f"{chosen[index].name} bucket {numbered[index]}/{per_buffer[index]}", end - start,
                            max(high - low for low, high in chosen[index].layout.owner_ranges(start, end))))
        for group in groups:
            layout = SpanningLayout(tuple(chosen[index].layout for index in group))
            named = chosen[group[0]].name if len(group) == 1 else f"{chosen[group[0]].name} ..."
            buckets.append((f"{len(group)} persistent buffer{'' if len(group) == 1 else 's'} ({named})", layout.numel,
                            layout.share_numel))
        found = []
        for what, numel, largest in buckets:
            if quantized_reduction:
                found += quantized_exchange(phase, largest, what)
            else:
                found.append(moved(phase, reduction, numel * communication_width, what))
        return found

    def quantized_exchange(phase: str, largest: int, what: str) -> list[Collective]:
        """A bucket's two int4 all-to-alls, values (two per byte) then fp32 scales: every owner's row
        (`largest` elements at most) within the node, the node's sums across nodes (one rank per
        node: ranks 0, K, 2K, ...); the exchange's temporaries are the first call's."""
        chunk, blocks = gradient_chunk(largest)
        temporary = gradient_exchange_temporary_bytes(largest, world_size, ranks_per_node)
        found = []
        for rows, group_size, stride, where in ((world_size, ranks_per_node, 1, "node"),
                                                (nodes, nodes, ranks_per_node, "across nodes")):
            found.append(moved(phase, "all_to_all", rows * chunk // 2, f"{what} int4, {where}", group_size, stride,
                               0 if found else temporary))
            found.append(moved(phase, "all_to_all", rows * blocks * FP32_BYTES, f"{what} scales, {where}",
                               group_size, stride))
        return found

    def gather(phase: str, buffer: Buffer, group_size: int) -> list[Collective]:
        padded = buffer.layout.padded_numel
        if not zero.zero_quantized_weights:
            return [moved(phase, "all_gather", padded * width, buffer.name, group_size)]
        # qwZ (`nano.zeropp.quantized_weights`): int8 values, then one fp32 scale per block of each share
        scales = group_size * block_count(padded // group_size) * FP32_BYTES
        temporary = weight_gather_temporary_bytes(padded // group_size, group_size)
        return [moved(phase, "all_gather", padded, f"{buffer.name} int8", group_size, temporary=temporary),
                moved(phase, "all_gather", scales, f"{buffer.name} scales", group_size)]

    def gathers(phase: str, calls: list[list[str]]) -> list[Collective]:
        """Each fetch's or prefetch's units in one call (`nano.coalesced_gather`); with hpZ or qwZ
        each buffer has a wire format of its own and is gathered by itself."""
        found = []
        for units in calls:
            chosen = [buffer for unit in units for buffer in buffers if buffer.unit == unit and buffer.sharded]
            if not zero.gathers_each_buffer_alone:
                what = units[0] if len(units) == 1 else f"{units[0]} and {len(units) - 1} more units"
                payload = sum(buffer.layout.padded_numel for buffer in chosen) * width
                # several buffers in one call pass through a staging tensor of the call's size
                found.append(moved(phase, "all_gather", payload, what, temporary=payload if len(chosen) > 1 else 0))
                continue
            for unit in units:
                group_size = secondary_group if unit in with_secondary else world_size
                for buffer in buffers:
                    if buffer.unit == unit and buffer.sharded:
                        found += gather(phase, buffer, group_size)
                if secondary_group:
                    with_secondary.add(unit)
        return found

    found: list[Collective] = []
    if stage >= 2:  # every micro-step gathers (stage 3) and reduces as backward goes
        for _ in range(config.gradient_accumulation_steps):
            if micro_step is not None:
                found += gathers("forward", micro_step.forward_calls)
                found += gathers("backward", micro_step.backward_calls)
            found += reductions("backward", buffers)
    else:  # once, at the boundary
        found += reductions("reduce_gradients", buffers)
    partitioned = config.stage_facts.partitions_parameters
    for buffer in buffers:  # Muon's whole gradients (and momentum at stage 3), held while the matrices update
        payload = buffer.layout.padded_numel * FP32_BYTES
        for call in range(muon_gathers(buffer.layout, world_size, partitioned) if buffer.muon else 0):
            what = f"{buffer.name} {'momentum' if call else 'gradient'}"
            found.append(moved("muon_gather", "all_gather", payload, what, temporary=(call + 1) * payload))
    if stage >= 1:
        found.append(moved("unscale_clip", "all_reduce", FP32_BYTES, "squared gradient norm"))
    whole = [buffer for buffer in buffers if not buffer.sharded] if stage >= 1 else []
    if stage == 3 and len(whole) > 1:  # the persistent buffers: one call through a staging tensor of its size
        payload = sum(buffer.layout.padded_numel for buffer in whole) * width
        return found + [moved("all_gather", "all_gather", payload, f"{len(whole)} persistent buffers",
                              temporary=payload)]
    # each whole buffer in one call, in place (`FlatParameterBuffer.gather_partitions`)
    return found + [moved("all_gather", "all_gather", buffer.layout.padded_numel * width, buffer.name)
                    for buffer in whole]


def explain(model: str, entries: list[ParameterEntry], blocks: list[str], config: NanoConfig,
            world_size: int, ranks_per_node: int | None = None) -> Walkthrough:
    """The walk-through of one steady optimizer step of `config` (its stage, precision, buckets,
    offload, ZeRO++ keys) on `world_size` ranks in nodes of `ranks_per_node` (None: one node), for a model
    given as its parameter table and blocks."""
    buffers = flat_buffers(entries, blocks, config, world_size)
    zero = config.zero_optimization
    micro_step = stage3_micro_step(model, entries, blocks, buffers, config) if zero.stage == 3 else None
    whole = micro_step.whole_after_forward if micro_step is not None else set()
    walk = Walkthrough(model, sum(entry.numel for entry in entries), zero.stage, world_size, config.precision,
                       config.gradient_accumulation_steps, buffers, moments(buffers, config, world_size, whole))
    walk.collectives = collectives(buffers, config, world_size, micro_step, ranks_per_node)
    walk.ranks_per_node = ranks_per_node
    return walk
