"""Per-rank bodies of tests/nano/test_muon.py: nano's Muon against the single-process reference,
against official DeepSpeed, and its bytes against the layout's arithmetic."""

from __future__ import annotations

import copy
import itertools

import torch

import zero_lab.nano as nano
from tests.nano.muon_reference import ADAM_LR, MUON_LR, WEIGHT_DECAY, MuonReference
from tests.nano.reference import build_model, loss_of, max_difference, micro_batch, train_steps
from tests.tolerances import ADAM_EPS, clipped_loss_bound, muon_parity_bound

MICRO_SIZE, STEPS = 2, 3
TOLERANCE = muon_parity_bound(MUON_LR, ADAM_LR, STEPS)  # tests/tolerances.py: 3.7e-6 (measured: at most 3.5e-7)


def muon_config(stage: int, accumulation: int = 1, clipping: float = 0.0, ns_method: str = "gram") -> dict:
    return {
        "train_micro_batch_size_per_gpu": MICRO_SIZE, "gradient_accumulation_steps": accumulation,
        "gradient_clipping": clipping, "steps_per_print": 10_000,
        "optimizer": {"type": "Muon", "params": {"muon_lr": MUON_LR, "adam_lr": ADAM_LR,
                                                 "eps": ADAM_EPS, "weight_decay": WEIGHT_DECAY,
                                                 "ns_method": ns_method}},
        "zero_optimization": {"stage": stage, "reduce_bucket_size": 64, "stage3_param_persistence_threshold": 0},
    }


def muon_cases() -> list[dict]:
    """Stages 1-3; clipping off and on (the norm is then the updates'); accumulation; the standard method."""
    return [dict(stage=stage, accumulation=1, clipping=0.0) for stage in (1, 2, 3)] + [
        dict(stage=2, accumulation=2, clipping=0.05), dict(stage=3, accumulation=1, clipping=0.05),
        dict(stage=1, accumulation=1, clipping=0.0, ns_method="standard")]


def train(model: torch.nn.Module, config: dict, rank: int, on_step=None, module=nano) -> list[float]:
    engine, *_ = module.initialize(model=model, model_parameters=model.parameters(), config=config)
    return train_steps(engine, config, rank, STEPS, MICRO_SIZE, on_step)


def reference_worker(rank: int, world_size: int) -> list[str]:
    """After every step every parameter matches the reference within TOLERANCE."""
    failures, initial = [], build_model()
    for case in muon_cases():
        ns_method = case.get("ns_method", "gram")
        reference = MuonReference(initial, case["clipping"], ns_method)
        model, worst = copy.deepcopy(initial), [0.0]

        def compare(step: int, engine) -> None:
            reference.step(step, world_size, case["accumulation"], MICRO_SIZE)
            with nano.zero.GatheredParameters(list(model.parameters())):  # stage 3: whole while compared
                worst[0] = max(worst[0], max_difference(model, reference.model))

        train(model, muon_config(case["stage"], case["accumulation"], case["clipping"], ns_method), rank, compare)
        with nano.zero.GatheredParameters(list(model.parameters())):
            moved = max_difference(initial, model)
        print(f"[muon] W={world_size} {case} max |nano - reference| = {worst[0]:.3g}, moved {moved:.3g}", flush=True)
        if not worst[0] <= TOLERANCE or moved < 1e-3:
            failures.append(f"W={world_size} {case}: max |nano - reference| = {worst[0]:.3g} (moved {moved:.3g})")
    return failures


def official_worker(rank: int, world_size: int) -> list[str]:
    """nano and official DeepSpeed (its Newton-Schulz run eagerly: TORCHDYNAMO_DISABLE's switch), same
    model, data and Muon config, stages 1-3. Clipping off: every loss equal, bit for bit, on every
    CPU kernel set (the same operations in the same order). Clipping on: within `clipped_loss_bound`,
    since the two engines add the clip's sum of squares in other groupings, whose last bits depend
    on the kernels (a rank's second loss differed by 2.2e-8 at stages 1 and 2 under
    ATEN_CPU_CAPABILITY=avx2, and at stage 3 under default; bit for bit on avx512)."""
    import torch._dynamo.config

    from tests.nano.official_workers import import_official_deepspeed
    from zero_lab.nano.facade.official_config import to_official_config

    torch._dynamo.config.disable = True  # what TORCHDYNAMO_DISABLE=1 sets: official's @torch.compile runs eagerly
    deepspeed = import_official_deepspeed(world_size)
    failures, initial = [], build_model(seed=3)
    for stage, clipping in itertools.product((1, 2, 3), (0.0, 1.0)):
        config = muon_config(stage, clipping=clipping)
        ours = train(copy.deepcopy(initial), config, rank)
        theirs = train(copy.deepcopy(initial), to_official_config(config, device="cpu"), rank, module=deepspeed)
        print(f"[muon-official] W={world_size} stage {stage} clipping {clipping} nano {ours} official {theirs}",
              flush=True)
        close = ours == theirs if clipping == 0.0 else all(
            abs(mine - official) <= clipped_loss_bound(official, STEPS) for mine, official in zip(ours, theirs))
        if len(ours) != len(theirs) or not close:
            failures.append(f"stage {stage} clipping {clipping}: nano's losses {ours}, official's {theirs}")
    return failures


def bytes_worker(rank: int, world_size: int) -> list[str]:
    """Muon's states and Phase 2b's gathers, measured (live tensors; nano's collective counters around
    `prepare_updates`) against the layout's prediction (`predicted_bytes`), at stages 1-3."""
    from zero_lab.nano.muon.memory import predicted_bytes

    failures = []
    for stage in (1, 2, 3):
        model = build_model()
        engine, *_ = nano.initialize(model=model, model_parameters=model.parameters(), config=muon_config(stage))
        optimizer, gathered = engine.optimizer, []
        muon, prepare = optimizer.partition_optimizer, optimizer.partition_optimizer.prepare_updates

        def counted(partitions):
            before = optimizer.collectives.stats().get("all_gather", {"calls": 0, "bytes": 0})
            prepare(partitions)
            after = optimizer.collectives.stats().get("all_gather", {"calls": 0, "bytes": 0})
            gathered.append((after["calls"] - before["calls"], after["bytes"] - before["bytes"]))

        muon.prepare_updates = counted
        for step in range(2):
            engine.backward(loss_of(engine, micro_batch(step, 0, rank, MICRO_SIZE)))
            engine.step()
        flags = [optimizer.param_groups[buffer.group_index]["use_muon"] for buffer in optimizer.buffers]
        predicted = predicted_bytes([buffer.layout for buffer in optimizer.buffers], flags, rank, world_size,
                                    partitioned=stage == 3)  # official's policy: stage 3 partitions the momentum
        measured = engine.memory_breakdown()["optimizer_states"]
        expected = predicted["momentum"] + predicted["adam_states"]
        per_step = (predicted["gathers_per_step"], predicted["gather_bytes_per_step"])
        print(f"[muon-bytes] W={world_size} stage {stage} rank {rank}: states {measured} B (predicted {expected}), "
              f"gathers per step {gathered} (predicted {per_step})", flush=True)
        if measured != expected or gathered != [per_step, per_step]:
            failures.append(f"W={world_size} stage {stage} rank {rank}: states {measured} B, predicted {expected}; "
                            f"gathers {gathered}, predicted {per_step} per step")
    return failures
