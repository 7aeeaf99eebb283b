"""The gradient norm of the optimizer step makes no copy of a gradient partition: squaring a whole
partition at once (`partition.pow(2).sum()`) held a second partition for the length of the
reduction, 2273.5 MB for qwen3-0.6b at stage 2 on one GPU (reports/gpu-check.md). nano sums each
piece's dot product with itself, which allocates no tensor, over pieces of 2^16 elements on a CPU.
Measured here as the process's own peak resident memory (`ru_maxrss`, which the kernel keeps) around
the norm of a 2^27-element fp32 partition (512 MB), after a first norm has loaded the dot's code and
threads: it grows by less than 8 MB (one piece's view lives at a time; no tensor bytes), where
pow(2).sum() grows it by a partition; the norm is float64's within 1e-6. (torch.linalg.vector_norm holds nothing, but on CPU
it sums in fp32 without pairing: 7.7e-5 off a float64 norm of 4,000,000 normal numbers, where
pow(2).sum() and a dot of 2^16 elements are 2e-8 off, enough to move the clip; a dot of 2^22 is
2.7e-6 off.)"""

from __future__ import annotations

import resource

import torch

from tests.nano.reference import build_model
from tests.spawn import run_distributed

PARTITION = 1 << 27
MB = 2**20


def peak_growth(call) -> int:
    """How far the process's peak resident memory rose while `call()` ran."""
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    call()
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - before


def worker(rank: int, world_size: int) -> list[str]:
    import zero_lab.nano as nano

    model = build_model()
    config = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1,
              "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}, "zero_optimization": {"stage": 2}}
    engine, *_ = nano.initialize(model=model, model_parameters=model.parameters(), config=config)
    partition = torch.randn(PARTITION)  # the process's peak now: every page of it written
    engine.optimizer._global_norm([partition[:1 << 20]])  # the first dot's code and thread pool, counted before
    failures = []
    ours = peak_growth(lambda: engine.optimizer._global_norm([partition]))
    whole = peak_growth(lambda: partition.pow(2).sum())  # the measure can see a partition's temporary
    if ours >= 8 * MB:
        failures.append(f"the norm raised the peak by {ours / MB:.0f} MB; a partition is {PARTITION * 4 / MB:.0f} MB")
    if whole < PARTITION * 4 * 0.9:
        failures.append(f"pow(2).sum() raised the peak by {whole / MB:.0f} MB: the measure missed its temporary")
    expected = partition.double().pow(2).sum().sqrt().item()
    norm = engine.optimizer._global_norm([partition])
    if abs(norm - expected) > 1e-6 * expected:
        failures.append(f"norm {norm}, in float64 {expected}")
    return failures


def test_the_gradient_norm_holds_no_copy_of_a_partition():
    assert run_distributed(worker, 1) == []
