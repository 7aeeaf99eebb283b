"""Per-rank body: nano and official DeepSpeed train the `tiny` preset at stage 3 under the same
config, and each step's all-gathers are counted from outside (`workload.meters.comm_meter`).

Two more configs prefetch less than one block with reuse distance 0 (or prefetch nothing): there a
unit per decoder layer would gather more (or less) than official, which fetches each module's own
parameters; nano fetches as official does, so its bytes are official's on every config. For these
two the worker also checks what explains official's bytes, independently of nano's engine:
`fetch_policy`'s rules run over every module the forward calls (containers included: official
prefetches at each), one unit per module's own non-persistent parameters, predict official's extra
bytes over a step that gathers every parameter once.

The forward's and backward's calls are equal too: each fetch and each prefetch is one all-gather in
both engines. After Adam official gathers the persistent parameters in one call per parameter (its
`_allgather_params_coalesced` loops over them), nano in one call (`nano.coalesced_gather`): the
same bytes in fewer calls. The first step differs and is not compared: official records its trace
there and, while it does, frees and gathers again the persistent parameters at every use."""

from __future__ import annotations

import json
from importlib import resources

import torch

import zero_lab.nano as nano
from zero_lab.nano.facade.official_config import to_official_config
from zero_lab.workload.meters.comm_meter import CommMeter, difference
from zero_lab.workload.meters.wire_bytes import family
from tests.backend_holding import backend_holding_collective_tensors

STEPS, MICRO_SIZE, SEQUENCE = 3, 2, 16


def harness_zero3() -> dict:
    return json.loads(resources.files("zero_lab.harness").joinpath("configs/zero3.json").read_text())


def configs() -> dict[str, dict]:
    """The harness's zero3.json (reuse distance 0), DeepSpeed's defaults (no stage3_* key, no
    overlap_comm: every tiny parameter is then persistent), and zero3.json prefetching less than one
    tiny block (a block is 196,928 elements) at the default reuse distance."""
    defaults = harness_zero3()
    for key in [key for key in defaults["zero_optimization"] if key.startswith("stage3_") or key == "overlap_comm"]:
        del defaults["zero_optimization"][key]
    small_prefetch = harness_zero3()
    del small_prefetch["zero_optimization"]["stage3_max_reuse_distance"]
    small_prefetch["zero_optimization"].update(stage3_prefetch_bucket_size=20_000, overlap_comm=True)
    return {"zero3.json": harness_zero3(), "defaults": defaults, "prefetch 20000": small_prefetch}


def finer_configs() -> dict[str, dict]:
    """zero3.json (reuse distance 0) prefetching less than one block, and prefetching nothing."""
    configs = {}
    for label, prefetch in (("prefetch 20000, reuse 0", 20_000), ("prefetch 0, reuse 0", 0)):
        config = harness_zero3()
        config["zero_optimization"]["stage3_prefetch_bucket_size"] = prefetch
        configs[label] = config
    return configs


def forward_module_order(model: torch.nn.Module, ids: torch.Tensor) -> list[torch.nn.Module]:
    """Every module the forward calls, in the order their forwards begin (official's trace)."""
    called = []
    handles = [module.register_forward_pre_hook(lambda module, args: called.append(module))
               for module in model.modules()]
    with torch.no_grad():
        model(ids, labels=ids)
    for handle in handles:
        handle.remove()
    return called


def module_granularity_wire_bytes(config: dict, world_size: int) -> int:
    """All-gather wire bytes of one steady micro-step (fp32) by `fetch_policy`'s rules with official's
    granularity: a unit per module's own parameters above the persistence threshold."""
    from zero_lab.nano.config import NanoConfig
    from zero_lab.nano.policies.fetch_policy import FetchRules, TracedUse, simulate_micro_step
    from zero_lab.workload.models import build_model

    zero = NanoConfig.model_validate(config).zero_optimization
    model = build_model("tiny", seed=0)
    ids = torch.zeros(1, SEQUENCE, dtype=torch.long)
    trace, unit_numel = [], {}
    for index, module in enumerate(forward_module_order(model, ids)):
        own = list(module.parameters(recurse=False))
        sharded = sum(p.numel() for p in own if p.numel() > zero.stage3_param_persistence_threshold)
        name = f"module {id(module)}"
        if sharded:
            unit_numel[name] = sharded
        trace.append(TracedUse(index, name if sharded else None, sum(p.numel() for p in own)))
    rules = FetchRules(zero.stage3_prefetch_bucket_size, zero.stage3_max_live_parameters,
                       zero.stage3_max_reuse_distance)
    step = simulate_micro_step(trace, unit_numel, rules)
    return sum((world_size - 1) * -(-unit_numel[name] // world_size) * 4
               for name in step.forward_gathers + step.backward_gathers)


def all_gathers(meter: CommMeter, before: dict) -> tuple[int, int]:
    """(calls, wire bytes) of the all-gathers since the snapshot `before`."""
    moved = [count for name, count in difference(meter.snapshot(), before).items() if family(name) == "all_gather"]
    return sum(count.calls for count in moved), sum(count.wire_bytes for count in moved)


def gather_bytes_per_step(module, config: dict, rank: int, meter: CommMeter, after=None,
                          harness_groups: bool = False) -> tuple[list[tuple[int, int, int]], dict[str, int]]:
    """(all-gather calls, all-gather wire bytes, calls of them inside `engine.step()`) of each
    optimizer step, and the bytes this run's tensors hold: the most at each phase boundary over the
    steps, and the peak (CPU storage allocated since the model was built, `LiveStorageTracker`).
    `after(model, engine)` runs after the last step; `harness_groups`: the harness's weight-decay
    parameter groups (what `explain` assumes), else one group."""
    import gc

    from zero_lab.workload.meters.memory_meter import LiveStorageTracker
    from zero_lab.workload.models import build_model, parameter_groups

    found, held = [], {}
    with LiveStorageTracker("cpu") as tracker, backend_holding_collective_tensors():
        def boundary(moment: str) -> None:
            gc.collect()
            held[moment] = max(held.get(moment, 0), tracker.live_bytes)

        model = build_model("tiny", seed=0)
        groups = (parameter_groups(model, config["optimizer"]["params"]["weight_decay"]) if harness_groups
                  else model.parameters())
        engine, *_ = module.initialize(model=model, model_parameters=groups, config=config)
        generator = torch.Generator().manual_seed(rank)
        for _ in range(STEPS):
            ids = torch.randint(0, model.config.vocab_size, (MICRO_SIZE, SEQUENCE), generator=generator)
            before = meter.snapshot()
            loss = engine(ids, labels=ids).loss
            boundary("after forward")
            engine.backward(loss)
            boundary("after backward")
            before_step = meter.snapshot()
            engine.step()
            boundary("after step")
            found.append((*all_gathers(meter, before), all_gathers(meter, before_step)[0]))
        held["peak"] = tracker.peak_bytes
        if after is not None:
            after(model, engine)
    return found, held


def more_than_official(label: str, mine: dict[str, int], theirs: dict[str, int]) -> list[str]:
    """A line for each phase boundary (and the peak) where nano holds more bytes than official."""
    return [f"{label}: nano holds {mine[moment]} B {moment}, official {theirs[moment]} B"
            for moment in mine if mine[moment] > theirs[moment]]


def persistent_gathers(counted: dict[str, int]):
    """An `after` for `gather_bytes_per_step` noting how many persistent parameters each engine
    keeps whole: official's `persistent_parameters` (`stage3.py` `_post_step` hands them to
    `all_gather`, whose `_allgather_params_coalesced` starts one `all_gather_into_tensor` per
    parameter), nano's always-whole flat buffers (one per persistent parameter and group)."""
    from zero_lab.nano.sharded_flat_buffer import ShardedFlatBuffer

    def note(model, engine):
        optimizer = engine.optimizer
        if hasattr(optimizer, "persistent_parameters"):  # official
            counted["official"] = len(optimizer.persistent_parameters)
        else:
            counted["nano"] = sum(not isinstance(buffer, ShardedFlatBuffer) for buffer in optimizer.buffers)
    return note


def differences(label: str, mine: list, theirs: list, persistent: dict[str, int]) -> list[str]:
    """From the second step on (the first records the trace): equal all-gather wire bytes; equal
    calls in the forward and backward (one per fetch and per prefetch); in the step official's one
    call per persistent parameter (as many as nano keeps persistent buffers), nano's one for them all."""
    failures = []
    if [(calls - in_step, wire) for calls, wire, in_step in mine[1:]] != \
            [(calls - in_step, wire) for calls, wire, in_step in theirs[1:]]:
        failures.append(f"{label}: all-gathers per step nano {mine}, official {theirs} (calls, bytes, calls in step)"
                        f" differ outside the step or in bytes")
    in_step_calls = [in_step for _, _, in_step in theirs]
    if persistent["nano"] != persistent["official"] or in_step_calls != [persistent["official"]] * STEPS:
        failures.append(f"{label}: official's all-gather calls in each step {theirs} are not one per persistent "
                        f"parameter ({persistent}, nano's persistent buffers)")
    if [in_step for _, _, in_step in mine] != [min(persistent["nano"], 1)] * STEPS:
        failures.append(f"{label}: nano's all-gather calls in each step {mine} are not one for its "
                        f"{persistent['nano']} persistent buffers")
    return failures


def gather_bytes_worker(rank: int, world_size: int) -> list[str]:
    """From the second step on (the first records the trace), nano's all-gathers per step match
    official's on every config: the same wire bytes, the same calls in the forward and backward, and
    one call in the step where official makes one per persistent parameter (`differences`); official's
    bytes equal the per-module prediction on the two finer ones. At every phase boundary, and at its
    peak, nano holds no more bytes than official."""
    meter = CommMeter().install()  # before DeepSpeed keeps references to the collectives
    from tests.nano.official_workers import import_official_deepspeed

    deepspeed = import_official_deepspeed(world_size)
    failures = []
    for label, config in {**configs(), **finer_configs()}.items():
        config = {**config, "train_micro_batch_size_per_gpu": MICRO_SIZE}
        persistent: dict[str, int] = {}
        (mine, my_bytes), (theirs, their_bytes) = (
            gather_bytes_per_step(nano, config, rank, meter, after=persistent_gathers(persistent)),
            gather_bytes_per_step(deepspeed, to_official_config(config, device="cpu"), rank, meter,
                                  after=persistent_gathers(persistent)))
        print(f"[gathers] rank {rank} {label}: nano {mine} {my_bytes} official {theirs} {their_bytes} "
              f"persistent {persistent}", flush=True)
        failures += more_than_official(label, my_bytes, their_bytes)
        failures += differences(label, mine, theirs, persistent)
        if label == "zero3.json":
            once = theirs[-1][1]  # every parameter gathered once a step (equal to nano's, checked above)
        if label in finer_configs():
            extra = (module_granularity_wire_bytes(config, world_size)
                     - module_granularity_wire_bytes(harness_zero3(), world_size))
            if [wire for _, wire, _ in theirs[1:]] != [once + extra] * (STEPS - 1):
                failures.append(f"{label}: official's all-gather bytes per step {theirs} are not the per-module "
                                f"prediction {once + extra} (once a step {once} + {extra})")
    meter.uninstall()
    return failures


def explained_gathers_worker(rank: int, world_size: int) -> list[str]:
    """On the tiny preset, on every config above, nano records the module calls that
    `model_shapes.preset_module_calls` names (forward, then backward), and from the second step on
    makes the all-gather calls and moves the wire bytes per step that `zero-lab explain` predicts
    without building it."""
    from zero_lab.analysis.explain.explain import explain
    from zero_lab.nano.config import load_config
    from zero_lab.workload.model_shapes import preset_blocks, preset_module_calls, preset_parameters

    meter = CommMeter().install()
    failures, recorded = [], {}

    def note_trace(model, engine):
        names = {id(module): name for name, module in model.named_modules()}
        modules = {traced.index: names[id(traced.module)] for traced in engine.optimizer.gathering.traced}
        gathering = engine.optimizer.gathering
        recorded["calls"] = ([modules[use.module] for use in gathering.trace],
                             [modules[use.module] for use in gathering.backward_trace or []])

    for label, config in {**configs(), **finer_configs()}.items():
        config = {**config, "train_micro_batch_size_per_gpu": MICRO_SIZE}
        found, _ = gather_bytes_per_step(nano, config, rank, meter, after=note_trace, harness_groups=True)
        if recorded["calls"] != preset_module_calls("tiny"):
            failures.append(f"{label}: recorded calls {recorded['calls']}, not the preset's {preset_module_calls('tiny')}")
        walk = explain("tiny", preset_parameters("tiny"), preset_blocks("tiny"), load_config(config, world_size=world_size),
                       world_size)
        predicted = [item for item in walk.collectives if item.op == "all_gather"]
        predicted = (len(predicted), sum(item.wire_bytes for item in predicted))
        if [(calls, wire) for calls, wire, _ in found[1:]] != [predicted] * (STEPS - 1):
            failures.append(f"{label}: all-gather (calls, wire bytes) per step {found}, explain predicts {predicted}")
    meter.uninstall()
    return failures
