"""Per-rank bodies for hpZ (zero_hpz_partition_size): exact against the single-process reference,
backward's gathers inside the node, and the secondary partition's bytes as the formula counts them."""

from __future__ import annotations

import copy

import torch

import zero_lab.nano as nano
from tests.backend_holding import backend_holding_collective_tensors
from tests.nano.stage3_reference import TokenReference, build_trapnet, decay_groups, token_batch, token_loss
from tests.nano.stage3_workers import stage3_config, train
from tests.nano.workers import LR, MICRO_SIZE, WEIGHT_DECAY
from zero_lab.nano.zeropp.hierarchical_partition import HierarchicalShardedBuffer
from zero_lab.nano.memory.memory_formula import model_state_bytes
from zero_lab.workload.meters.comm_meter import CommMeter, difference

RANKS_PER_NODE = 2
CASES = (dict(accumulation=1, clipping=0.0, overlap=False, checkpointed=False),
         dict(accumulation=3, clipping=0.05, overlap=True, checkpointed=True))


def hpz_config(precision: str = "fp32", **options) -> dict:
    config = stage3_config(precision=precision, **options)
    config["zero_optimization"]["zero_hpz_partition_size"] = RANKS_PER_NODE
    return config


def inter_node_gather_bytes(counts) -> int:
    return sum(count.wire_inter_bytes for name, count in counts.items() if name.startswith("all_gather"))


def parity_worker(rank: int, world_size: int) -> list[str]:
    """Every step equals the reference (1e-5), with accumulation, clipping, prefetch and activation
    checkpointing; no backward all-gather crosses a node boundary, and of the forwards only a step's
    first gathers across nodes (official's rule: the secondary lives until the step)."""
    failures = []
    meter = CommMeter(ranks_per_node=RANKS_PER_NODE).install()
    try:
        for case in CASES:
            options = dict(case)
            initial = build_trapnet(checkpointed=options.pop("checkpointed"))
            reference = TokenReference(initial, LR, WEIGHT_DECAY, case["clipping"])
            backward_inter, forward_inter = [], []

            def between_steps(engine, step):
                """After step 0: count each later backward's (and each step's first forward's) gathers."""
                if step > 0:
                    return
                if not any(isinstance(buffer, HierarchicalShardedBuffer) for buffer in engine.optimizer.buffers):
                    failures.append(f"{case}: no buffer keeps a secondary partition")
                forward, backward = engine.forward, engine.backward

                def measured_forward(*args, **kwargs):
                    start = meter.snapshot()
                    output = forward(*args, **kwargs)
                    forward_inter.append(inter_node_gather_bytes(difference(meter.snapshot(), start)))
                    return output

                def measured_backward(loss, *args, **kwargs):
                    start = meter.snapshot()
                    backward(loss, *args, **kwargs)
                    backward_inter.append(inter_node_gather_bytes(difference(meter.snapshot(), start)))

                engine.forward = measured_forward
                engine.backward = measured_backward

            train(copy.deepcopy(initial), hpz_config(**options), rank, world_size, reference, failures,
                  f"hpZ W={world_size} {case}", between_steps=between_steps)
            if any(backward_inter) or len(backward_inter) != 2 * case["accumulation"]:
                failures.append(f"{case}: backward all-gathers sent {backward_inter} bytes across nodes")
            # A step's first forward gathers from the primaries (across nodes), the next micro-steps' from the
            # secondary; `train` reads the whole model after each step, which gathers too (across nodes), so
            # check the forwards only for accumulation's later micro-steps and the backward for all.
            later = [value for index, value in enumerate(forward_inter) if index % case["accumulation"]]
            if len(forward_inter) != 2 * case["accumulation"] or any(later):
                failures.append(f"{case}: forward all-gathers across nodes per micro-step: {forward_inter}")
    finally:
        meter.uninstall()
    return failures


def formula_total(config: dict, model, world_size: int, moment: str) -> int:
    """nano's documented bytes of every flat buffer the unit policy makes of this model, hpZ's
    secondary partitions included, nothing gathered."""
    from zero_lab.nano.config import load_config
    from zero_lab.nano.policies.stage3_units import choose_units
    from zero_lab.nano.units import split_groups_by_unit

    settings = load_config(config, world_size=world_size)
    groups = decay_groups(model, WEIGHT_DECAY)
    units = choose_units(model, [parameter for group in groups for parameter in group["params"]],
                         settings.zero_optimization)
    return sum(sum(model_state_bytes(3, settings.precision, sum(parameter.numel() for parameter in parameters),
                                     world_size, moment, sharded=units[unit_index].sharded,
                                     hpz_partition_size=settings.zero_optimization.zero_hpz_partition_size).values())
               for unit_index, _, parameters in split_groups_by_unit(units, groups))


def memory_worker(rank: int, world_size: int) -> list[str]:
    """Each sharded buffer holds its partition plus padded / K elements of secondary from the
    first gather to the step, and only its partition after it: the formula's figures, buffer by
    buffer and in all (live bytes tracked from outside the engine), fp32 and bf16."""
    import gc

    from zero_lab.workload.meters.memory_meter import LiveStorageTracker

    failures = []
    for precision in ("fp32", "bf16"):
        config = hpz_config(precision)
        with LiveStorageTracker("cpu") as tracker, backend_holding_collective_tensors():
            model = build_trapnet(spare=False)  # a unit no forward uses gathers (and keeps) nothing after a step
            engine, *_ = nano.initialize(model=model, model_parameters=decay_groups(model, WEIGHT_DECAY), config=config)
            sharded = [buffer for buffer in engine.optimizer.buffers if isinstance(buffer, HierarchicalShardedBuffer)]
            for step in range(2):  # Adam's states exist from the first step on
                batch = token_batch(step, 0, rank, MICRO_SIZE)
                loss = token_loss(engine, batch)
                engine.backward(loss)
                del loss
                for moment in ("backward", "between_steps"):
                    if moment == "between_steps":
                        engine.step()
                    gc.collect()
                    live = tracker.live_bytes - batch.untyped_storage().nbytes()
                    expected = formula_total(config, build_trapnet(spare=False), world_size, moment)
                    if step == 1 and live != expected:
                        failures.append(f"{precision} step {step} {moment}: live bytes {live} != formula {expected}")
                    for buffer in sharded:
                        figure = model_state_bytes(3, precision, buffer.layout.numel, world_size, moment, sharded=True,
                                                   hpz_partition_size=RANKS_PER_NODE)["parameters"]
                        if buffer.parameter_bytes() != figure or (buffer.secondary is not None) != (moment == "backward"):
                            failures.append(f"{precision} step {step} {moment}: {buffer.parameter_bytes()} parameter "
                                            f"bytes, formula {figure}; secondary kept: {buffer.secondary is not None}")
    return failures


def resume_worker(rank: int, world_size: int, directory: str) -> list[str]:
    """A checkpoint saved with hpZ and loaded into a fresh engine: the loaded values reach every
    gather (the secondaries made before the load are dropped), so the resumed steps equal the
    uninterrupted run's bit for bit."""
    failures = []
    initial = build_trapnet(spare=False)
    engines = []
    for _ in range(2):
        model = copy.deepcopy(initial)
        engines.append(nano.initialize(model=model, model_parameters=decay_groups(model, WEIGHT_DECAY),
                                       config=hpz_config())[0])
    straight, resumed = engines

    def step(engine, index):
        engine.backward(token_loss(engine, token_batch(index, 0, rank, MICRO_SIZE)))
        engine.step()

    step(straight, 0)
    straight.save_checkpoint(directory)
    step(resumed, 5)  # other values, and (the forward below) secondaries made from them, before the load
    with torch.no_grad():
        resumed(token_batch(9, 0, rank, MICRO_SIZE)[:, :-1])
    if not any(getattr(buffer, "secondary", None) is not None for buffer in resumed.optimizer.buffers):
        failures.append("no secondary partition existed before the load: the test would not test the drop")
    resumed.load_checkpoint(directory)
    for index in (1, 2):
        step(straight, index)
        step(resumed, index)
    with nano.zero.GatheredParameters(list(straight.module.parameters()) + list(resumed.module.parameters())):
        for (name, mine), theirs in zip(straight.module.named_parameters(), resumed.module.parameters()):
            if not torch.equal(mine, theirs):
                failures.append(f"{name}: resumed differs by {(mine - theirs).abs().max().item():.3g}")
    return failures
