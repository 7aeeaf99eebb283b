"""Per-rank bodies for stage 3, each held to the single-process AdamW reference of TrapNet."""

from __future__ import annotations

import copy
import itertools

import torch

import zero_lab.nano as nano
from tests.backend_holding import backend_holding_collective_tensors
from tests.nano.stage3_reference import (TokenReference, build_trapnet, decay_groups, token_batch, token_loss)
from tests.nano.reference import max_difference
from tests.nano.workers import LR, WEIGHT_DECAY, nano_config
from tests.tolerances import ADAM_EPS, adam_parity_bound

STEPS, MICRO_SIZE = 3, 2
TOLERANCE = adam_parity_bound(LR, STEPS)  # tests/tolerances.py: 3.7e-6


def stage3_config(persistence: int = 10, **options) -> dict:
    """Stage 3 with the norms' biases and weights (6 elements) persistent, the rest sharded."""
    config = nano_config(3, **options)
    config["zero_optimization"].update(stage3_param_persistence_threshold=persistence, stage3_max_reuse_distance=0)
    return config


def compare_whole(model, reference, failures, label, steps_done: int, zero=nano.zero):
    """Gather every parameter, as a user would read them (`zero`: nano's or official's), and compare
    with the reference. The spare block gets no gradient: DeepSpeed (and nano) count it as zero, so
    only AdamW's decoupled decay moves its matrix, where torch.optim skips a parameter without a gradient."""
    with zero.GatheredParameters(list(model.parameters())):
        used = [(mine, theirs) for (name, mine), theirs in zip(model.named_parameters(), reference.model.parameters())
                if not name.startswith("spare.")]
        difference = max((mine.detach().float() - theirs.detach().float()).abs().max().item() for mine, theirs in used)
        spare, start = model.spare[0].linear.weight.detach().float(), reference.model.spare[0].linear.weight.float()
        decayed = (spare - start * (1 - LR * WEIGHT_DECAY) ** steps_done).abs().max().item()
    if not difference <= TOLERANCE or not decayed <= TOLERANCE:
        failures.append(f"{label}: max |nano - reference| = {difference:.3g}, spare off its decay by {decayed:.3g}")


def train(model, config, rank, world_size, reference, failures, label, between_steps=None, groups=None):
    groups = groups if groups is not None else decay_groups(model, WEIGHT_DECAY)
    engine, *_ = nano.initialize(model=model, model_parameters=groups, config=config)
    accumulation = config["gradient_accumulation_steps"]
    for step in range(STEPS):
        for micro in range(accumulation):
            engine.backward(token_loss(engine, token_batch(step, micro, rank, MICRO_SIZE)))
            engine.step()
        reference.step(step, world_size, accumulation, MICRO_SIZE)
        compare_whole(model, reference, failures, f"{label} step {step}", step + 1)
        if between_steps is not None:
            between_steps(engine, step)
    if engine.optimizer.gathering.live.numel:
        failures.append(f"{label}: {engine.optimizer.gathering.live.numel} elements still gathered after training")
    return engine


def parity_cases() -> list[dict]:
    """Accumulation, clipping, both reduce paths, overlap (prefetch), buckets smaller than a
    parameter, and activation checkpointing: 16 cases."""
    cases = []
    for (accumulation, clipping), reduce_scatter, (overlap, bucket), checkpointed in itertools.product(
            ((1, 0.0), (3, 0.05)), (True, False), ((False, 500_000_000), (True, 5)), (False, True)):
        cases.append(dict(accumulation=accumulation, clipping=clipping, reduce_scatter=reduce_scatter,
                          overlap=overlap, bucket=bucket, checkpointed=checkpointed))
    return cases


def parity_worker(rank: int, world_size: int) -> list[str]:
    """Tied weights, a block called twice, a block never used, and the cases above."""
    failures = []
    for case in parity_cases():
        options = dict(case)
        checkpointed = options.pop("checkpointed")
        initial = build_trapnet(checkpointed=checkpointed)
        reference = TokenReference(initial, LR, WEIGHT_DECAY, case["clipping"])
        train(copy.deepcopy(initial), stage3_config(**options), rank, world_size, reference, failures,
              f"world size {world_size} {case}")
    return failures


def eval_forward_worker(rank: int, world_size: int) -> list[str]:
    """A forward under torch.no_grad() and one in eval mode with no backward, between steps: nothing
    stays gathered after either, and training stays exact."""
    failures = []
    initial = build_trapnet()
    reference = TokenReference(initial, LR, WEIGHT_DECAY, 0.0)

    def evaluate(engine, step):
        with torch.no_grad():
            engine(token_batch(step, 9, rank, MICRO_SIZE))
        engine.eval()
        with torch.no_grad():
            engine(token_batch(step, 8, rank, MICRO_SIZE))
        engine.train()
        if engine.optimizer.gathering.live.numel or engine.memory_breakdown()["gathered_parameters"]:
            failures.append(f"step {step}: an evaluation left {engine.optimizer.gathering.live.numel} elements gathered")

    train(copy.deepcopy(initial), stage3_config(), rank, world_size, reference, failures, "eval", evaluate)
    return failures


def unused_parameters_worker(rank: int, world_size: int) -> list[str]:
    """The spare block gets no gradient: AdamW's decay alone moves it (the reference agrees); with
    ignore_unused_parameters false the error names it."""
    failures = []
    model = build_trapnet()
    try:
        engine, *_ = nano.initialize(model=model, config=stage3_config(ignore_unused=False))
        engine.backward(token_loss(engine, token_batch(0, 0, rank, MICRO_SIZE)))
        failures.append("ignore_unused_parameters=false did not raise")
    except nano.NanoConfigError as error:
        if "spare" not in str(error):
            failures.append(f"the error does not name the spare block: {error}")
    return failures


def modifier_rank_worker(rank: int, world_size: int) -> list[str]:
    """GatheredParameters(modifier_rank=0): rank 0's edit reaches every rank and survives the next
    steps (the fp32 master follows in bf16 too); without modifier_rank an edit is dropped."""
    failures = []
    for precision in ("fp32", "bf16"):
        model = build_trapnet()
        engine, *_ = nano.initialize(model=model, config=stage3_config(precision=precision))
        with nano.zero.GatheredParameters(model.embed.weight, modifier_rank=0):
            if rank == 0:
                model.embed.weight.data.fill_(0.5)
        with nano.zero.GatheredParameters([model.blocks[0].linear.weight]):
            model.blocks[0].linear.weight.data.fill_(7.0)  # not kept: no modifier rank
        with nano.zero.GatheredParameters(model.parameters()):
            embed = model.embed.weight.detach().float().clone()
            linear = model.blocks[0].linear.weight.detach().float().clone()
        if not torch.all(embed == 0.5) or torch.any(linear == 7.0):
            failures.append(f"{precision}: embed all 0.5: {bool(torch.all(embed == 0.5))}, "
                            f"unkept edit dropped: {not bool(torch.any(linear == 7.0))}")
        # a step that changes nothing but decay (none at lr 0)
        engine.optimizer.partition_optimizer.param_groups[0]["lr"] = 0.0
        engine.backward(token_loss(engine, token_batch(0, 0, rank, MICRO_SIZE)))
        engine.step()
        with nano.zero.GatheredParameters(model.embed.weight):
            if not torch.all(model.embed.weight.float() == 0.5):
                failures.append(f"{precision}: the master did not follow the edit: a step at lr 0 moved it")
    return failures


def tiny_qwen3(checkpointing: bool):
    """Two Qwen3 decoder layers with tied embeddings (Qwen3-0.6B's shape of model, tiny)."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    config = Qwen3Config(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, head_dim=8, tie_word_embeddings=True,
                         use_cache=False)
    model = Qwen3ForCausalLM(config)
    if checkpointing:
        model.gradient_checkpointing_enable()
    return model


def qwen3_beside_reference(checkpointing: bool = False):
    """(model, its copy for the reference, torch's AdamW over that copy): tiny_qwen3 twice, the same weights."""
    model = tiny_qwen3(checkpointing)
    reference_model = copy.deepcopy(model)
    return model, reference_model, torch.optim.AdamW(decay_groups(reference_model, WEIGHT_DECAY), lr=LR,
                                                                     eps=ADAM_EPS)


def train_qwen3_beside_reference(engine, model, reference_model, reference, rank: int, world_size: int,
                                 clipping: float = 0.0) -> list[str]:
    """STEPS steps of `engine` on this rank's token batch and of the reference on every rank's
    (clipped to `clipping` when above 0), the whole parameters compared after each step."""
    failures = []

    def batch(step, which):
        generator = torch.Generator().manual_seed(1000 * step + which)
        return torch.randint(0, 32, (MICRO_SIZE, 6), generator=generator)

    for step in range(STEPS):
        ids = batch(step, rank)
        engine.backward(engine(input_ids=ids, labels=ids).loss)
        engine.step()
        every = torch.cat([batch(step, other) for other in range(world_size)])
        reference.zero_grad()
        reference_model(input_ids=every, labels=every).loss.backward()
        if clipping > 0:
            torch.nn.utils.clip_grad_norm_(reference_model.parameters(), clipping)
        reference.step()
        with nano.zero.GatheredParameters(list(model.parameters())):
            difference = max_difference(model, reference_model)
        if not difference <= TOLERANCE:
            failures.append(f"step {step}: max |nano - reference| = {difference:.3g}")
    return failures


def hf_checkpointing_worker(rank: int, world_size: int) -> list[str]:
    """Hugging Face's gradient_checkpointing_enable(): the recompute runs inside backward, with the
    layer's unit gathered by the hook on its outputs' gradients; tied embeddings and head."""
    failures = []
    model, reference_model, reference = qwen3_beside_reference(checkpointing=True)
    engine, *_ = nano.initialize(model=model, model_parameters=decay_groups(model, WEIGHT_DECAY),
                                 config=stage3_config(persistence=16))
    names = [entry.unit.name for entry in engine.optimizer.gathering.entries]
    linears = [name for name, module in model.named_modules()
               if isinstance(module, torch.nn.Linear) and name != "lm_head"]  # the head is tied: the root's
    if names != [*linears, "root"]:
        failures.append(f"units {names}")
    attention_calls = []
    model.model.layers[0].self_attn.register_forward_hook(lambda *_: attention_calls.append(1))
    failures += train_qwen3_beside_reference(engine, model, reference_model, reference, rank, world_size)
    if len(attention_calls) != 2 * STEPS:  # forward, then the recomputation in backward
        failures.append(f"layer 0's attention ran {len(attention_calls)} times in {STEPS} steps: no recomputation")
    return failures


def formula(config: dict, model, world_size: int, moment: str, gathered: set[str]) -> dict[str, int]:
    """nano's documented bytes for every flat buffer the unit policy makes of this model, summed;
    `gathered` names the units whole at the moment."""
    from zero_lab.nano.config import load_config
    from zero_lab.nano.memory.memory_formula import model_state_bytes, total
    from zero_lab.nano.policies.stage3_units import choose_units
    from zero_lab.nano.units import split_groups_by_unit

    settings = load_config(config, world_size=world_size)
    groups = decay_groups(model, WEIGHT_DECAY)
    units = choose_units(model, [parameter for group in groups for parameter in group["params"]],
                         settings.zero_optimization)
    return total([model_state_bytes(3, settings.precision, sum(parameter.numel() for parameter in parameters),
                                    world_size, moment, sharded=units[unit_index].sharded,
                                    gathered=units[unit_index].name in gathered)
                  for unit_index, _, parameters in split_groups_by_unit(units, groups)])


def memory_worker(rank: int, world_size: int) -> list[str]:
    """Live bytes inside a block's forward, after backward, while Adam runs and between steps equal
    the documented formula exactly (tracked from outside, as at stages 0-2), in fp32 and bf16."""
    import gc

    from zero_lab.workload.meters.memory_meter import LiveStorageTracker

    failures = []
    for precision in ("fp32", "bf16"):
        config = stage3_config(precision=precision, bucket=11)
        config["zero_optimization"]["stage3_prefetch_bucket_size"] = 0  # only the unit in use is gathered
        with LiveStorageTracker("cpu") as tracker, backend_holding_collective_tensors():
            model = build_trapnet()
            engine, *_ = nano.initialize(model=model, model_parameters=decay_groups(model, WEIGHT_DECAY), config=config)
            measured, batch = {}, {}

            def inside_forward(module, args):  # registered after the unit's hooks: block 2's linear is whole
                if not torch.is_grad_enabled():  # the no_grad forward: no activation is saved
                    gc.collect()
                    inputs = sum(tensor.untyped_storage().nbytes() for tensor in (args[0], batch["ids"]))
                    measured["forward"] = (tracker.live_bytes - inputs, engine.memory_breakdown())

            def live_besides_the_batch():
                gc.collect()
                return tracker.live_bytes - batch["ids"].untyped_storage().nbytes()

            def inside_step(optimizer, args, kwargs):
                measured["step"] = (live_besides_the_batch(), engine.memory_breakdown())

            model.blocks[2].linear.register_forward_pre_hook(inside_forward)
            engine.optimizer.partition_optimizer.register_step_pre_hook(inside_step)
            for step in range(2):  # Adam's states exist from the first step on: measure the second
                batch["ids"] = token_batch(step, 0, rank, MICRO_SIZE)
                with torch.no_grad():
                    engine(batch["ids"][:, :-1])
                loss = token_loss(engine, batch["ids"])
                engine.backward(loss)
                del loss
                measured["backward"] = (live_besides_the_batch(), engine.memory_breakdown())
                engine.step()
            batch.clear()
            gc.collect()
            measured["between_steps"] = (tracker.live_bytes, engine.memory_breakdown())
        for moment, (live, reported) in measured.items():
            expected = formula(config, build_trapnet(), world_size, moment,
                               {"root", "blocks.2.linear"} if moment == "forward" else set())
            label = f"ws {world_size} {precision} {moment}"
            if live != sum(expected.values()):
                failures.append(f"{label}: live bytes {live} != formula {sum(expected.values())} ({expected})")
            mismatched = {key: (reported[key], value) for key, value in expected.items() if reported[key] != value}
            if mismatched:
                failures.append(f"{label}: memory_breakdown vs formula {mismatched}")
    return failures


def knobs_worker(rank: int, world_size: int) -> list[str]:
    """Under DeepSpeed's stage-3 keys the engine gathers what `fetch_policy` says for the trace it
    recorded at the first step: the units gathered in the second step's forward and backward, in
    order, and those whole right after its forward. overlap_comm plays no part."""
    from zero_lab.nano.policies.fetch_policy import FetchRules, simulate_micro_step

    failures = []
    cases = [  # (overlap, prefetch, max_live, reuse distance)
        (False, 50_000_000, 1_000_000_000, 0), (True, 50_000_000, 1_000_000_000, 0), (True, 1, 1_000_000_000, 0),
        (True, 50_000_000, 66 + 2 * 36, 0), (False, 0, 1_000_000_000, 1_000_000_000), (False, 0, 1_000_000_000, 0),
        (False, 0, 1_000_000_000, 100), (True, 40, 1_000_000_000, 0),
    ]
    for overlap, prefetch, max_live, reuse in cases:
        config = stage3_config(overlap=overlap)
        config["zero_optimization"].update(stage3_prefetch_bucket_size=prefetch, stage3_max_live_parameters=max_live,
                                           stage3_max_reuse_distance=reuse)
        model = build_trapnet()
        engine, *_ = nano.initialize(model=model, config=config)
        gathering = engine.optimizer.gathering
        gathered: list[str] = []
        for entry in gathering.entries:  # a gather by itself (unshard) or in one call with others (join_gather)
            for verb in ("unshard", "join_gather"):
                def counting(*args, entry=entry, original=getattr(entry.buffers[0], verb), **kwargs):
                    if not entry.gathered:
                        gathered.append(entry.unit.name)
                    return original(*args, **kwargs)
                setattr(entry.buffers[0], verb, counting)
        live_counts: list[tuple[int, int]] = []  # at each use: the running count, and the sum it stands for
        def checked_prefetch(position, original=gathering._prefetch):
            live_counts.append((gathering.live.numel, sum(entry.numel for entry in gathering.entries if entry.gathered)))
            return original(position)
        gathering._prefetch = checked_prefetch
        for step in range(2):  # the second step follows the first one's trace
            gathered.clear()
            loss = token_loss(engine, token_batch(step, 0, rank, MICRO_SIZE))
            forward, after_forward = list(gathered), {entry.unit.name for entry in gathering.entries if entry.gathered}
            gathered.clear()
            engine.backward(loss)
            backward = list(gathered)
            if step == 0:
                trace, backward_trace = list(gathering.trace), gathering.backward_trace
            engine.step()
        expected = simulate_micro_step(trace, {entry.unit.name: entry.numel for entry in gathering.entries},
                                       FetchRules(prefetch, max_live, reuse), held="root", backward=backward_trace)
        label = f"overlap={overlap} prefetch={prefetch} max_live={max_live} reuse={reuse}"
        if not live_counts or any(live != summed for live, summed in live_counts):
            failures.append(f"{label}: the running count of gathered elements left the sum over units: {live_counts}")
        if (forward, backward, after_forward) != (expected.forward_gathers, expected.backward_gathers,
                                                  expected.whole_after_forward):
            failures.append(f"{label}: gathered forward {forward}, backward {backward}, whole after forward "
                            f"{sorted(after_forward)}; the policy says {expected}")
    return failures


def init_parity_worker(rank: int, world_size: int) -> list[str]:
    """A model built under zero.Init (every parameter a 1/N slice from its module's __init__ on)
    trains exactly as the reference built without it; nothing of it was whole beforehand."""
    failures = []
    reference = TokenReference(build_trapnet(), LR, WEIGHT_DECAY, 0.0)
    with nano.zero.Init():
        model = build_trapnet()
    whole = [name for name, parameter in model.named_parameters() if parameter.numel() != 0]
    if whole:
        failures.append(f"built whole under Init: {whole}")
    train(model, stage3_config(), rank, world_size, reference, failures, "built under Init",
          groups=decay_groups(model, WEIGHT_DECAY, shapes={p: p.zero_lab_shape for p in model.parameters()}))
    return failures


def init_memory_worker(rank: int, world_size: int) -> list[str]:
    """Building a Qwen3 model under zero.Init never holds more than 1/N of the model (its slices,
    padded) plus its largest module's own parameters (and its buffers), tracked from outside; the
    untied head Hugging Face builds before tying it is the largest module while it is built."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from zero_lab.workload.meters.memory_meter import LiveStorageTracker

    config = Qwen3Config(vocab_size=4096, hidden_size=64, intermediate_size=192, num_hidden_layers=4,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=16, tie_word_embeddings=True,
                         use_cache=False)
    with LiveStorageTracker("cpu") as tracker:
        start = tracker.live_bytes
        with nano.zero.Init() as init:
            model = Qwen3ForCausalLM(config)
        peak = tracker.peak_bytes - start
    slices = sum(parameter.zero_lab_init_partition.untyped_storage().nbytes() for parameter in model.parameters())
    assert init.partitioned_bytes > slices, "the untied head's slice was kept, then dropped by tying"
    largest = max(sum(torch.Size(parameter.zero_lab_shape).numel() for parameter in module.parameters(recurse=False))
                  for module in model.modules()) * 4
    buffers = sum(buffer.untyped_storage().nbytes() for buffer in model.buffers())
    bound = slices + largest + buffers
    whole = sum(torch.Size(parameter.zero_lab_shape).numel() for parameter in model.parameters()) * 4
    print(f"[init] rank {rank} peak {peak} bound {bound} (slices {slices} + largest module {largest} + buffers "
          f"{buffers}); the whole model is {whole}", flush=True)
    if peak != bound:  # the head, built whole beside every other slice: exactly the bound
        return [f"peak {peak} bytes != 1/N of the model + the largest module + buffers = {bound}"]
    return []
