"""Per-rank bodies for test_gpu_path_distributed.py (run by tests.spawn.run_distributed)."""

from __future__ import annotations

import copy
import os

import torch
import torch.distributed

import zero_lab.nano as nano
from zero_lab.nano.collectives import COLLECTIVES_AT_WORLD_ONE
from tests.nano.reference import ReferenceTrainer, build_model, max_difference, parameter_groups
from tests.nano.workers import FP32_TOLERANCE, LR, MICRO_SIZE, WEIGHT_DECAY, nano_config, train_nano
from tests.tolerances import ADAM_EPS

# What nano may call in torch.distributed, by family (gloo's reduce-scatter is an all-to-all;
# newer torch names the single-tensor forms all_gather_single and reduce_scatter_single).
TORCH_COLLECTIVES = {"all_reduce": "all_reduce", "all_to_all_single": "reduce_scatter",
                     "reduce_scatter": "reduce_scatter", "reduce_scatter_tensor": "reduce_scatter",
                     "reduce_scatter_single": "reduce_scatter", "all_gather": "all_gather",
                     "all_gather_into_tensor": "all_gather", "all_gather_single": "all_gather",
                     "broadcast": "broadcast"}
# The families each stage must call at least once in two steps at world size 1, when asked to.
EXPECTED = {0: {"broadcast", "all_reduce"},
            1: {"broadcast", "reduce_scatter", "all_reduce", "all_gather"},
            2: {"broadcast", "reduce_scatter", "all_reduce", "all_gather"},
            3: {"broadcast", "reduce_scatter", "all_reduce", "all_gather"}}


def count_torch_collectives() -> dict[str, int]:
    """Wrap torch.distributed's collectives in this process; the dict counts calls per family."""
    calls = dict.fromkeys(set(TORCH_COLLECTIVES.values()), 0)
    for name, family in TORCH_COLLECTIVES.items():
        original = getattr(torch.distributed, name, None)
        if original is None:
            continue

        def counted(*args, _family=family, _original=original, **kwargs):
            calls[_family] += 1
            return _original(*args, **kwargs)

        setattr(torch.distributed, name, counted)
    return calls


def world_of_one_worker(rank: int, world_size: int, run_them: bool) -> list[str]:
    """Every stage trains two steps at world size 1 through gloo: with COLLECTIVES_AT_WORLD_ONE=1 each
    collective really runs (and the parameters still match the single-process reference); without
    it, none does."""
    failures = []
    if run_them:
        os.environ[COLLECTIVES_AT_WORLD_ONE] = "1"
    calls = count_torch_collectives()
    for stage in (0, 1, 2, 3):
        for name in calls:
            calls[name] = 0
        model = build_model()
        reference = ReferenceTrainer(copy.deepcopy(model), LR, WEIGHT_DECAY, 0.0)
        engine = train_nano(model, nano_config(stage, bucket=40), rank, steps=2)
        for step in range(2):
            reference.step(step, world_size, 1, MICRO_SIZE)
        called = {name for name, count in calls.items() if count}
        if run_them and not EXPECTED[stage] <= called:
            failures.append(f"stage {stage}: {sorted(EXPECTED[stage] - called)} never called; called {calls}")
        if run_them and not engine.comm_stats():
            failures.append(f"stage {stage}: nano recorded no collective")
        if not run_them and called:
            failures.append(f"stage {stage}: a world of one called {sorted(called)} without being asked")
        gap = max_difference(engine.module, reference.model)
        if gap > FP32_TOLERANCE:
            failures.append(f"stage {stage}: parameters differ from the reference by {gap}")
        engine.destroy()
    return failures


class Weighted(torch.nn.Module):
    """loss = sum(weight * x): the gradient of the weight is x itself, whatever the weight."""

    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.full((8,), 1e-3))

    def forward(self, x):
        return (self.weight * x).sum()


# Each rank's fp16 gradient: finite alone, 2 x 40000 = 80000 > 65504 (fp16's largest) when summed.
GRADIENT = 40000.0


def fp16_order_worker(rank: int, world_size: int) -> list[str]:
    """Official DeepSpeed's stage 1/2 reduce-scatter divides each rank's gradients by the world size
    before summing them (its `average_tensor`), and so does its stage 3 (`reduce_scatter_coalesced`,
    `runtime/comm/coalesced_collectives.py`: `div_(world_sz)` before the call); its stage 0 and its
    all-reduce path (`reduce_scatter: false`) sum first and divide after (`postscale_gradients`,
    DeepSpeed's documented default). With two ranks whose fp16 gradients each fit but whose sum does not, the
    first order steps like the single-process reference on the mean gradient; the second overflows
    and skips the step, on every rank."""
    failures = []
    cases = [(1, True, True), (2, True, True), (0, True, False), (1, False, False), (2, False, False),
             (3, True, True)]
    for stage, reduce_scatter, steps in cases:
        label = f"stage {stage} reduce_scatter={reduce_scatter}"
        torch.manual_seed(0)
        model = Weighted()
        reference = torch.optim.AdamW(copy.deepcopy(model).parameters(), lr=LR, eps=ADAM_EPS,
                                     weight_decay=WEIGHT_DECAY)
        config = nano_config(stage, precision="fp16", reduce_scatter=reduce_scatter, fp16={"loss_scale": 1.0})
        engine, optimizer, _, _ = nano.initialize(model=model, model_parameters=[{"params": [model.weight],
                                                                                "weight_decay": WEIGHT_DECAY}],
                                                  config=config)
        inputs = torch.full((8,), GRADIENT, dtype=torch.float16, device=engine.device)
        engine.backward(engine(inputs))
        engine.step()
        if optimizer.overflow == steps or engine.skipped_steps != (0 if steps else 1):
            failures.append(f"{label}: overflow={optimizer.overflow}, skipped_steps={engine.skipped_steps}; "
                            f"official would {'step' if steps else 'skip'}")
        if steps:
            expected = reference.param_groups[0]["params"][0]
            expected.grad = torch.full((8,), GRADIENT)  # the mean of the ranks' gradients
            reference.step()
            gap = (engine.module.weight.detach().float() - expected.detach()).abs().max().item()
            if gap > 1e-5:
                failures.append(f"{label}: weight differs from the reference step by {gap}")
        engine.destroy()
    return failures


def publish_worker(rank: int, world_size: int) -> list[str]:
    """Stages 1/2 publish each flat buffer with one all_gather_into_tensor into the buffer itself,
    even with allgather_bucket_size far under the partition (the list form of all_gather would
    gather through a flat temporary per piece)."""
    failures = []
    for stage in (1, 2):
        model = build_model()
        engine, optimizer, _, _ = nano.initialize(model=model, model_parameters=parameter_groups(model, WEIGHT_DECAY),
                                                  config=nano_config(stage, gather_bucket=4))
        fulls = {buffer.full.untyped_storage().data_ptr() for buffer in optimizer.buffers}
        calls = []
        collectives = optimizer.collectives
        for name in [name for name in ("all_gather", "all_gather_into_tensor") if hasattr(collectives, name)]:
            original = getattr(collectives, name)

            def recording(output, local, *args, _name=name, _original=original, **kwargs):
                into_buffer = isinstance(output, torch.Tensor) and output.untyped_storage().data_ptr() in fulls
                calls.append((_name, into_buffer))
                return _original(output, local, *args, **kwargs)

            setattr(collectives, name, recording)
        engine.backward(engine(torch.randn(MICRO_SIZE, 7)).pow(2).mean())
        engine.step()
        if calls != [("all_gather_into_tensor", True)] * len(optimizer.buffers):
            failures.append(f"stage {stage}: publish gathered with {calls}, {len(optimizer.buffers)} buffers")
        engine.destroy()
    return failures
