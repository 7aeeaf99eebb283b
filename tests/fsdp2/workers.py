"""Per-rank bodies of the FSDP2 tests, run by tests.spawn.run_distributed; each returns failures.

The reference and the configs are nano's (tests/nano/reference.py, tests/nano/workers.py): the
single-process torch.optim.AdamW on the global batch, and nano itself on the same micro-batches.
"""

from __future__ import annotations

import copy
import gc
import itertools

import torch

import zero_lab.fsdp2 as fsdp2
import zero_lab.nano as nano
from zero_lab.fsdp2.memory_formula import layout_bytes, moment_bytes, step_temporary_bytes
from zero_lab.workload.meters.comm_meter import CommMeter
from zero_lab.workload.meters.memory_meter import LiveStorageTracker
from tests.backend_holding import backend_holding_collective_tensors
from tests.nano.reference import ReferenceTrainer, build_model, loss_of, micro_batch, parameter_groups, train_steps
from tests.nano.workers import FP32_TOLERANCE, LR, MICRO_SIZE, STEPS, WEIGHT_DECAY, nano_config
from tests.tolerances import ADAM_EPS


def parity_cases() -> list[dict]:
    """Stages 2 and 3 x accumulation 1/3 x clipping off/on (8), fp32."""
    return [dict(stage=stage, accumulation=accumulation, clipping=clipping)
            for stage, accumulation, clipping in itertools.product((2, 3), (1, 3), (0.0, 0.05))]


def whole(parameter: torch.Tensor) -> torch.Tensor:
    """A parameter's full values: FSDP2's DTensor gathered, nano's as it is."""
    return (parameter.full_tensor() if hasattr(parameter, "full_tensor") else parameter).detach().float()


def train(module, config: dict, rank: int, steps: int, on_step=None) -> tuple[object, list[float]]:
    """The harness's loop with either impl: per micro-step forward, engine.backward, engine.step;
    returns the model and this rank's losses, one per micro-step."""
    engine_module = fsdp2 if module == "fsdp2" else nano
    model = build_model()
    engine, _, _, _ = engine_module.initialize(model=model, model_parameters=parameter_groups(model, WEIGHT_DECAY),
                                               config=config)
    losses = train_steps(engine, config, rank, steps, MICRO_SIZE,
                         None if on_step is None else lambda step, _: on_step(step, model))
    return model, losses


def parity_worker(rank: int, world_size: int) -> list[str]:
    """After every step FSDP2's parameters match the reference; its losses and final parameters
    match nano's on the same micro-batches."""
    failures = []
    for case in parity_cases():
        config = nano_config(case["stage"], accumulation=case["accumulation"], clipping=case["clipping"])
        reference = ReferenceTrainer(build_model(), LR, WEIGHT_DECAY, case["clipping"])
        label = f"world size {world_size} {case}"

        def compare(step: int, model: torch.nn.Module) -> None:
            reference.step(step, world_size, case["accumulation"], MICRO_SIZE)
            difference = max((whole(ours) - theirs.detach()).abs().max().item()
                             for ours, theirs in zip(model.parameters(), reference.model.parameters()))
            if not difference <= FP32_TOLERANCE:
                failures.append(f"{label} step {step}: max |fsdp2 - reference| = {difference:.3g}")

        fsdp2_model, fsdp2_losses = train("fsdp2", copy.deepcopy(config), rank, STEPS, compare)
        nano_model, nano_losses = train("nano", copy.deepcopy(config), rank, STEPS)
        loss_gap = max(abs(a - b) for a, b in zip(fsdp2_losses, nano_losses))
        if len(fsdp2_losses) != len(nano_losses) or not loss_gap <= FP32_TOLERANCE:
            failures.append(f"{label}: losses fsdp2 {fsdp2_losses} vs nano {nano_losses}")
        parameter_gap = max((whole(ours) - whole(theirs)).abs().max().item()
                            for ours, theirs in zip(fsdp2_model.parameters(), nano_model.parameters()))
        if not parameter_gap <= FP32_TOLERANCE:
            failures.append(f"{label}: final max |fsdp2 - nano| = {parameter_gap:.3g}")
    return failures


def live_bytes(tracker: LiveStorageTracker) -> int:
    gc.collect()
    return tracker.live_bytes


def hold_optimizer_step(engine, tracker: LiveStorageTracker, measured: dict) -> None:
    """Make the engine's optimizer step record, as measured["optimizer_step"], the most bytes it
    held beyond what was alive when it began."""
    inner_step = engine.optimizer.step

    def step(*args, **kwargs):
        before = live_bytes(tracker)
        tracker.reset_peak()
        result = inner_step(*args, **kwargs)
        measured["optimizer_step"] = tracker.peak_bytes - before
        return result

    engine.optimizer.step = step


def memory_worker(rank: int, world_size: int) -> list[str]:
    """Bytes alive after the backward and between steps equal FSDP2's formula exactly, on every
    rank, fp32 and bf16, stages 2 and 3 (the tracker counts a DTensor as its local shard); its
    fused torch.optim step holds nothing beyond them (`step_temporary_bytes`)."""
    failures = []
    for precision, stage in itertools.product(("fp32", "bf16"), (2, 3)):
        tracker = LiveStorageTracker("cpu")
        # Entered before the model exists, so every storage it and FSDP2 make is seen. Only all_reduce
        # is held: our engine's own collective (the norm); torch's FSDP2 drops its gather and
        # reduce-scatter buffers by reference, and a slow gloo thread keeps at most the last of those
        # (the backward's leftover below), not all of them.
        with tracker, backend_holding_collective_tensors(("all_reduce",)):
            model = build_model()
            shapes = [tuple(parameter.shape) for parameter in model.parameters()]
            engine, _, _, _ = fsdp2.initialize(model=model, model_parameters=parameter_groups(model, WEIGHT_DECAY),
                                               config=nano_config(stage, precision=precision))
            measured, temporaries = {}, {}
            hold_optimizer_step(engine, tracker, temporaries)
            for step in range(2):  # Adam's states exist from the first step on: measure the second
                engine.backward(loss_of(engine, micro_batch(step, 0, rank, MICRO_SIZE)))
                measured["backward"] = live_bytes(tracker)
                engine.step()
            measured["between_steps"] = live_bytes(tracker)
        groups = [[tuple(parameter.shape) for parameter in group["params"]] for group in engine.optimizer.param_groups]
        expected_temporaries = step_temporary_bytes(groups, world_size, "fused", rank)
        if temporaries["optimizer_step"] != expected_temporaries:
            failures.append(f"rank {rank} ws {world_size} {precision} stage {stage}: the optimizer step held "
                            f"{temporaries['optimizer_step']} bytes beyond the states, formula {expected_temporaries}")
        for moment, live in measured.items():
            expected = moment_bytes(shapes, world_size, moment, rank)
            # Right after the backward gloo's finished reduce-scatter work may still hold its input,
            # the unit's unsharded gradients (padded, fp32 or bf16), until its thread lets go
            # (zero_lab/workload/meters/memory_meter.py): exactly that much more, or nothing more.
            leftover = world_size * layout_bytes(shapes, world_size)["gradients"] // (2 if precision == "bf16" else 1)
            if moment == "backward" and live == expected + leftover:
                continue
            if live != expected:
                failures.append(f"rank {rank} ws {world_size} {precision} stage {stage} {moment}: live bytes {live} "
                                f"!= formula {expected}")
    return failures


def collectives_worker(rank: int, world_size: int) -> list[str]:
    """The collectives FSDP2 calls while it trains (counted by the harness's CommMeter), stages 2
    and 3: in a world of one none (torch copies instead of its all-gather and reduce-scatter, the
    engine skips the norm's all_reduce), so gpu-check's one-GPU FSDP2 rows show 0 comm MB; in a
    larger world its all-gathers and reduce-scatters, which the meter does see."""
    failures = []
    for stage in (2, 3):
        meter = CommMeter().install()
        try:
            train("fsdp2", nano_config(stage), rank, 2)
        finally:
            meter.uninstall()
        called = {name for name, count in meter.snapshot().items() if count.calls}
        if world_size == 1 and called:
            failures.append(f"stage {stage}, a world of one called {sorted(called)}")
        if world_size > 1 and not {"all_gather_single", "reduce_scatter_single"} <= called:
            failures.append(f"stage {stage}, world size {world_size}: the meter saw only {sorted(called)}")
    return failures


def tied_qwen3(seed: int = 0) -> torch.nn.Module:
    """The tiny preset with its LM head tied to the embedding, as qwen3-0.6b's is (gpu-check's
    model; tiny and small are untied)."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from zero_lab.workload.model_shapes import PRESETS, SHARED

    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(Qwen3Config(**{**PRESETS["tiny"], **SHARED, "tie_word_embeddings": True}))
    model.config.use_cache = False
    return model


def tied_embeddings_worker(rank: int, world_size: int) -> list[str]:
    """FSDP2 keeps a tied LM head tied (one sharded parameter, both modules see it) and trains it
    as nano does: per-step losses and gradient norms within 1e-5, stages 2 and 3, clipping on."""
    from zero_lab.workload.models import parameter_groups as harness_groups

    failures = []
    for stage in (2, 3):
        runs = {}
        for module in (fsdp2, nano):
            model = tied_qwen3()
            config = {**nano_config(stage, clipping=1.0), "train_micro_batch_size_per_gpu": 2}
            engine, _, _, _ = module.initialize(model=model, model_parameters=harness_groups(model, WEIGHT_DECAY),
                                                config=config)
            trace = []
            for step in range(3):
                tokens = torch.randint(0, 260, (2, 32), generator=torch.Generator().manual_seed(1000 * step + rank))
                loss = engine(input_ids=tokens, labels=tokens).loss
                engine.backward(loss)
                engine.step()
                trace += [loss.item(), engine.get_global_grad_norm()]
            if model.lm_head.weight is not model.model.embed_tokens.weight:
                failures.append(f"stage {stage}: {module.__name__} untied the LM head from the embedding")
            runs[module.__name__] = trace
        gap = max(abs(a - b) for a, b in zip(runs["zero_lab.fsdp2"], runs["zero_lab.nano"]))
        if not gap <= FP32_TOLERANCE:
            failures.append(f"stage {stage}: losses and norms fsdp2 {runs['zero_lab.fsdp2']} vs nano {runs['zero_lab.nano']}")
    return failures


def muon_worker(rank: int, world_size: int) -> list[str]:
    """FSDP2 with Muon (zero_lab/fsdp2/muon.py) against a single-process torch.optim.Muon + AdamW on
    the global batch, stages 2 and 3, clipping (of the gradients, FSDP2's rule) off and on: within
    1e-6 at one rank. Over ranks torch's bf16 Newton-Schulz runs on DTensor shards, whose products
    add up in another order, and five bf16 iterations amplify the roundings: measured 3.2e-3 after
    3 steps at W=2, where the parameters moved 0.042; the bound there is 5e-3."""
    from tests.nano.muon_reference import ADAM_LR, MUON_LR, WEIGHT_DECAY as MUON_DECAY
    from tests.nano.muon_workers import muon_config

    failures, worst = [], 0.0
    for stage, clipping in ((2, 0.0), (3, 0.05)):
        config = muon_config(stage, clipping=clipping)
        reference = build_model()
        matrices = [parameter for parameter in reference.parameters() if parameter.dim() >= 2]
        others = [parameter for parameter in reference.parameters() if parameter.dim() < 2]
        optimizers = [torch.optim.Muon(matrices, lr=MUON_LR, weight_decay=MUON_DECAY, momentum=0.95, nesterov=True,
                                       adjust_lr_fn="original"),
                      torch.optim.AdamW(others, lr=ADAM_LR, betas=(0.9, 0.95), eps=ADAM_EPS, weight_decay=MUON_DECAY)]

        def compare(step: int, model: torch.nn.Module) -> None:
            nonlocal worst
            inputs = torch.cat([micro_batch(step, 0, other, MICRO_SIZE) for other in range(world_size)])
            for optimizer in optimizers:
                optimizer.zero_grad()
            loss_of(reference, inputs).backward()
            if clipping > 0:
                torch.nn.utils.clip_grad_norm_(reference.parameters(), clipping)
            for optimizer in optimizers:
                optimizer.step()
            difference = max((whole(ours) - theirs.detach()).abs().max().item()
                             for ours, theirs in zip(model.parameters(), reference.parameters()))
            worst = max(worst, difference)
            if not difference <= (1e-6 if world_size == 1 else 5e-3):
                failures.append(f"stage {stage} clipping {clipping} step {step}: max |fsdp2 - torch Muon| = "
                                f"{difference:.3g}")

        engine_model = build_model()
        shapes = [tuple(parameter.shape) for parameter in engine_model.parameters()]
        engine, *_ = fsdp2.initialize(model=engine_model, model_parameters=engine_model.parameters(), config=config)
        for step in range(STEPS):
            engine.backward(loss_of(engine, micro_batch(step, 0, rank, MICRO_SIZE)))
            engine.step()
            compare(step, engine_model)
        held = sum((value.to_local() if hasattr(value, "to_local") else value).untyped_storage().nbytes()
                   for state in engine.optimizer.state.values() for value in state.values()
                   if isinstance(value, torch.Tensor))
        predicted = layout_bytes(shapes, world_size, rank, [len(shape) >= 2 for shape in shapes])["optimizer_states"]
        if held != predicted:
            failures.append(f"stage {stage} rank {rank}: optimizer states {held} B, the formula says {predicted}")
    moved = max((whole(ours) - start.detach()).abs().max().item()
                for ours, start in zip(engine_model.parameters(), build_model().parameters()))
    print(f"[fsdp2-muon] W={world_size} max |fsdp2 - torch.optim.Muon reference| = {worst:.3g}, moved {moved:.3g}",
          flush=True)
    if moved < 0.02:
        failures.append(f"the parameters moved only {moved:.3g}")
    return failures
