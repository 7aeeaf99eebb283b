"""nano (issue 17) and FSDP2 (issue 19) on a CUDA GPU through NCCL at world size 1: skipped without
CUDA (tests/conftest.py); `pytest -m gpu` and `make gpu-check` run them on a GPU machine.

The process group is NCCL with one rank and ZERO_LAB_COLLECTIVES_AT_WORLD_ONE=1, so every one of
nano's collectives really goes through NCCL (a world of one would skip them otherwise).
    parity:        stages 0-3 against the single-process AdamW reference (tests/nano/reference.py);
    exact bytes:   torch.cuda.memory_allocated at phase boundaries equals the bytes nano says it
                   holds on the device (every tensor a multiple of the allocator's 512-byte blocks);
    offload:       pinned host masters, nothing of the optimizer on the device, still the reference's
                   parameters;
    zero.Init:     partitions built on the GPU (finding 4), then trained like any model.
    FSDP2:         `zero_lab.fsdp2` at stages 2 and 3 with accumulation and clipping against the same
                   reference, its shards on the GPU.
"""

from __future__ import annotations

import copy
import os

import pytest
import torch
import torch.distributed

import zero_lab.nano as nano
from zero_lab.launch.ports import free_port
from zero_lab.nano.collectives import COLLECTIVES_AT_WORLD_ONE
from tests.nano.reference import ReferenceTrainer, build_model
from tests.nano.workers import FP32_TOLERANCE, LR, MICRO_SIZE, STEPS, WEIGHT_DECAY, nano_config, train_nano

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module", autouse=True)
def nccl_world_of_one():
    saved = dict(os.environ)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), RANK="0", LOCAL_RANK="0",
                      WORLD_SIZE="1", LOCAL_WORLD_SIZE="1", **{COLLECTIVES_AT_WORLD_ONE: "1"})
    torch.cuda.set_device(0)
    torch.distributed.init_process_group("nccl", rank=0, world_size=1)
    try:
        yield
    finally:
        torch.distributed.destroy_process_group()
        os.environ.clear()
        os.environ.update(saved)


def cpu_gap(first: torch.nn.Module, second: torch.nn.Module) -> float:
    return max((a.detach().float().cpu() - b.detach().float().cpu()).abs().max().item()
               for a, b in zip(first.parameters(), second.parameters()))


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
@pytest.mark.parametrize("overlap", [False, True])
def test_every_stage_matches_the_reference_through_nccl(stage, overlap):
    initial = build_model()
    reference = ReferenceTrainer(initial, LR, WEIGHT_DECAY, 0.05)
    model = copy.deepcopy(initial)
    gaps = []

    def compare(step, engine):
        reference.step(step, 1, 2, MICRO_SIZE)
        gaps.append(cpu_gap(model, reference.model))

    engine = train_nano(model, nano_config(stage, accumulation=2, clipping=0.05, bucket=40, overlap=overlap),
                        0, STEPS, compare)
    assert engine.device.type == "cuda" and next(model.parameters()).is_cuda
    assert engine.comm_stats(), "no collective went through NCCL"
    assert max(gaps) <= FP32_TOLERANCE, gaps
    engine.destroy()


class Wide(torch.nn.Module):
    """Two 128 x 128 fp32 layers: every tensor nano allocates is a multiple of 512 bytes, so the
    caching allocator's figure is nano's to the byte."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.first = torch.nn.Linear(128, 128, bias=False)
        self.second = torch.nn.Linear(128, 128, bias=False)

    def forward(self, inputs):
        return self.second(torch.tanh(self.first(inputs)))


@pytest.mark.parametrize("stage", [1, 2])
def test_allocated_bytes_at_phase_boundaries_are_nanos_own(stage):
    torch.cuda.synchronize()
    inputs = torch.randn(4, 128, device="cuda")
    baseline = torch.cuda.memory_allocated()
    model = Wide()
    engine, *_ = nano.initialize(model=model, config=nano_config(stage, bucket=8192))

    def device_bytes() -> tuple[int, int]:
        torch.cuda.synchronize()
        return torch.cuda.memory_allocated() - baseline, engine.memory_breakdown(by_device=True)["device"]["total"]

    measured = {"initialized": device_bytes()}
    loss = engine(inputs).pow(2).mean()
    engine.backward(loss)
    del loss
    measured["after_backward"] = device_bytes()
    engine.step()
    measured["after_step"] = device_bytes()
    assert all(allocated == held for allocated, held in measured.values()), measured
    assert measured["after_step"][0] > measured["initialized"][0]  # Adam's states appeared
    engine.destroy()


@pytest.mark.parametrize("stage", [2, 3])
def test_offload_with_pinned_memory_keeps_the_optimizer_on_the_host(stage):
    initial = build_model()
    reference = ReferenceTrainer(initial, LR, WEIGHT_DECAY, 0.0)
    model = copy.deepcopy(initial)
    config = nano_config(stage, bucket=40, overlap=True)
    config["zero_optimization"]["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
    engine = train_nano(model, config, 0, STEPS, lambda step, engine: reference.step(step, 1, 1, MICRO_SIZE))
    optimizer = engine.optimizer
    assert optimizer.placement.pins and all(master.is_pinned() for master in optimizer.master_partitions)
    places = engine.memory_breakdown(by_device=True)
    assert places["device"]["optimizer_states"] == 0 and places["host"]["optimizer_states"] > 0
    assert cpu_gap(model, reference.model) <= FP32_TOLERANCE
    engine.destroy()


def test_zero_init_partitions_on_the_gpu_then_trains():
    initial = build_model()
    reference = ReferenceTrainer(initial, LR, WEIGHT_DECAY, 0.0)
    with nano.zero.Init():
        torch.manual_seed(0)
        model = build_model()
    partitions = [parameter.zero_lab_init_partition for parameter in model.parameters()]
    assert all(partition.is_cuda for partition in partitions)
    engine = train_nano(model, nano_config(3, bucket=40), 0, STEPS,
                        lambda step, engine: reference.step(step, 1, 1, MICRO_SIZE))
    assert cpu_gap(model, reference.model) <= FP32_TOLERANCE
    engine.destroy()


@pytest.mark.parametrize("stage", [2, 3])
def test_fsdp2_matches_the_reference_on_the_gpu_with_its_states_there(stage):
    """FSDP2 moves the CPU inputs to the GPU itself (its root's pre-forward on CUDA), clips on the
    GPU (the norm's squares on the engine's device) and steps torch's AdamW on CUDA shards."""
    from tests.fsdp2.workers import train as train_either

    reference = ReferenceTrainer(build_model(), LR, WEIGHT_DECAY, 0.05)
    gaps = []

    def compare(step, model):
        reference.step(step, 1, 2, MICRO_SIZE)
        gaps.append(max((ours.full_tensor().detach().float().cpu() - theirs.detach()).abs().max().item()
                        for ours, theirs in zip(model.parameters(), reference.model.parameters())))

    model, losses = train_either("fsdp2", nano_config(stage, accumulation=2, clipping=0.05), 0, STEPS, compare)
    assert all(parameter.to_local().is_cuda for parameter in model.parameters())
    assert max(gaps) <= FP32_TOLERANCE, gaps
    assert len(losses) == 2 * STEPS and all(loss == loss for loss in losses)

