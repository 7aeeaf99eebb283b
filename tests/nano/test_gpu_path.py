"""The GPU path's defects a CPU can catch (issue 17; docs/gpu.md lists each finding and its test).

A CPU has one device, so these tests *pretend* a second one: the meta device, where tensors have
a dtype, a shape and a device but no values. Pretending the host is `meta` makes every tensor an
offloaded optimizer keeps on the host distinguishable from the communication device's (the CPU),
so a test can record the device of every tensor handed to a collective, as NCCL would refuse a
host tensor. Pretending the accelerator is `meta` does the same for `zero.Init`.
"""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from zero_lab.nano.init import partitions as init_partitions
from zero_lab.nano.offload import placement as placement_module
from zero_lab.nano.collectives import Collectives
from zero_lab.nano.config import load_config
from zero_lab.nano.stage1 import Stage1Optimizer
from zero_lab.nano.stage2 import Stage2Optimizer
from zero_lab.nano.offload.placement import OffloadPlacement, host_threads
from zero_lab.nano.policies.stage3_units import choose_units
from tests.nano.reference import build_model, loss_of, micro_batch, parameter_groups
from tests.nano.workers import nano_config

OPERATIONS = ("all_reduce", "reduce_scatter", "all_gather_into_tensor", "broadcast")


def record_devices(collectives, seen: list) -> None:
    """Wrap each collective of `collectives` so that it first notes (operation, device) of every
    tensor it is handed (lists included), then runs as before."""
    for operation in OPERATIONS:
        original = getattr(collectives, operation)

        def recording(*args, _operation=operation, _original=original, **kwargs):
            for argument in (*args, *kwargs.values()):
                for tensor in (argument if isinstance(argument, list) else [argument]):
                    if isinstance(tensor, torch.Tensor):
                        seen.append((_operation, tensor.device))
            return _original(*args, **kwargs)

        setattr(collectives, operation, recording)


def offloaded_optimizer(stage: int, precision: str, host: torch.device, monkeypatch, seen: list):
    """A stage's ZeRO optimizer on the CPU with the optimizer offloaded to a pretended `host`."""
    monkeypatch.setattr(placement_module, "HOST", host)
    model = build_model()
    if precision != "fp32":
        model.to({"bf16": torch.bfloat16, "fp16": torch.float16}[precision])
    raw = nano_config(stage, precision=precision, bucket=40)
    raw["zero_optimization"]["offload_optimizer"] = {"device": "cpu"}
    config = load_config(raw, world_size=1)
    collectives = Collectives()
    record_devices(collectives, seen)
    groups = parameter_groups(model, 0.1)
    units = choose_units(model, [p for group in groups for p in group["params"]], config.zero_optimization)
    placement = OffloadPlacement(torch.device("cpu"), offload_optimizer=True)
    names = {parameter: name for name, parameter in model.named_parameters()}
    optimizer_class = {1: Stage1Optimizer, 2: Stage2Optimizer}[stage]
    return model, optimizer_class(model, units, groups, config, collectives, placement, names)


@pytest.mark.parametrize("stage", [1, 2])  # stage 0 refuses offload
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_every_gradient_bucket_goes_to_collectives_on_the_communication_device(stage, precision, monkeypatch):
    """Finding 3: with the optimizer offloaded the gradient partition is on the host, but the
    buckets reduced into it live where the collectives run (nccl refuses host tensors)."""
    seen: list = []
    model, optimizer = offloaded_optimizer(stage, precision, torch.device("meta"), monkeypatch, seen)
    assert optimizer.gradient_partition(0).device.type == "meta"  # the pretence holds: the host is elsewhere
    seen.clear()
    inputs = micro_batch(0, 0, 0, 2).to(next(model.parameters()).dtype)
    loss_of(model, inputs).backward()
    optimizer.after_backward()
    optimizer.gradient_collection.reduce_at_boundary()
    reductions = [entry for entry in seen if entry[0] in ("all_reduce", "reduce_scatter")]
    assert reductions, "no bucket was reduced"
    assert {device.type for _, device in reductions} == {"cpu"}, reductions


def test_publishing_an_offloaded_master_converts_on_the_host(monkeypatch):
    """Finding 7: the fp32 host master becomes the 16-bit device partition through a 16-bit host
    temporary; no copy between places changes the dtype (which needs a device temporary in fp32)."""
    model, optimizer = offloaded_optimizer(1, "bf16", torch.device("cpu"), monkeypatch, [])
    monkeypatch.setattr(placement_module, "HOST", torch.device("cpu"))
    device_partition = torch.empty(optimizer.buffers[0].partition.numel(), dtype=torch.bfloat16, device="meta")
    master = optimizer.master_partitions[0]
    assert master.dtype == torch.float32 and master.device.type == "cpu"

    class CrossPlaceCopies(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.copies = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func is torch.ops.aten.copy_.default and args[0].device != args[1].device:
                self.copies.append((args[0].dtype, args[1].dtype))
            return func(*args, **(kwargs or {}))

    with CrossPlaceCopies() as watched:
        optimizer.placement.copy(device_partition, master)
    assert watched.copies == [(torch.bfloat16, torch.bfloat16)]


def test_zero_init_moves_parameters_to_the_communication_device_first():
    """Finding 4: a module is built on the CPU; its parameters are broadcast and gathered from the
    device the collectives communicate from (as DeepSpeed's Init moves them to the accelerator)."""
    seen: list = []
    collectives = Collectives()
    collectives.device = torch.device("meta")  # pretend the accelerator
    record_devices(collectives, seen)
    layer = torch.nn.Linear(6, 4)
    for parameter in layer.parameters():
        init_partitions.partition(parameter, collectives)
        init_partitions.whole_values(parameter, collectives)
    assert [operation for operation, _ in seen] == ["broadcast", "all_gather_into_tensor", "all_gather_into_tensor"] * 2
    assert {device.type for _, device in seen} == {"meta"}


def test_pinning_follows_the_runs_device_not_the_machine(monkeypatch):
    """Finding 8: a --device cpu offload run on a GPU machine pins nothing (no CUDA context)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert not OffloadPlacement(torch.device("cpu"), offload_optimizer=True, pin_memory=True).pins
    assert OffloadPlacement(torch.device("cuda", 0), offload_optimizer=True, pin_memory=True).pins
    assert not OffloadPlacement(torch.device("cuda", 0), offload_optimizer=True, pin_memory=False).pins


def test_host_adam_gets_the_ranks_share_of_the_cores():
    """Finding 10: not torchrun's OMP_NUM_THREADS=1, but this rank's cores."""
    assert host_threads({"LOCAL_WORLD_SIZE": "2"}, cores=16) == 8
    assert host_threads({"LOCAL_WORLD_SIZE": "8"}, cores=16) == 2
    assert host_threads({}, cores=16) == 16
    assert host_threads({"LOCAL_WORLD_SIZE": "32"}, cores=16) == 1


class QueuedLandings(OffloadPlacement):
    """The offload placement with its device-to-host copies queued (as with pinned memory on CUDA):
    each landing's moment is a name, and waiting for it is noted."""

    waited: list = []

    def start_landing(self, source, destination):
        return source.clone(), "queued"

    def finish_landing(self, ready):
        self.waited.append(ready)


def test_reduced_shares_land_on_the_host_only_once_their_copy_is_waited_for():
    """Finding 10: with overlap the bucket's hook returns with the copy queued; the host partition
    is written when more than `max_in_flight` copies are queued, or at the end of backward."""
    from types import SimpleNamespace

    from zero_lab.nano.gradient_reduction import BucketReducer

    QueuedLandings.waited = []
    placement = QueuedLandings(torch.device("cpu"), offload_optimizer=True)
    reducer = BucketReducer(Collectives(), use_reduce_scatter=False, max_in_flight=2, placement=placement)
    buffer = SimpleNamespace(own_range=lambda start, end: (start, end), partition_start=0)
    partition = torch.zeros(5)
    for index in range(5):  # five one-element buckets, values 1..5
        reducer.launch(buffer, torch.full((1,), float(index + 1)), index, index + 1, partition)
    # two reductions in flight, two copies queued, and only the first one landed
    assert len(reducer.pending) == 2 and len(placement.landings) == 2
    assert partition.tolist() == [1.0, 0.0, 0.0, 0.0, 0.0] and len(QueuedLandings.waited) == 1
    reducer.finish_all()
    assert partition.tolist() == [1.0, 2.0, 3.0, 4.0, 5.0] and len(QueuedLandings.waited) == 5


def test_a_share_for_several_partitions_lands_in_each_once_its_copy_is_waited_for():
    """A bucket spanning whole buffers (stage 3's persistent ones) hands its share to several
    gradient partitions: the queued host copy is the whole share, cut into the partitions in order
    once it is waited for, copied in a window's first reduction and added in later ones."""
    from zero_lab.nano.gradient_reduction import BucketReducer

    QueuedLandings.waited = []
    reducer = BucketReducer(Collectives(), use_reduce_scatter=False, max_in_flight=1,
                            placement=QueuedLandings(torch.device("cpu"), offload_optimizer=True))
    first, second = torch.zeros(2), torch.zeros(3)
    for accumulate in (False, True):
        reducer.launch_shares(torch.arange(1.0, 6.0), [], 0, [first, second], accumulate=accumulate)
    assert first.tolist() == [0.0, 0.0] and second.tolist() == [0.0, 0.0, 0.0]  # nothing waited for yet
    reducer.finish_all()
    assert len(QueuedLandings.waited) == 2
    assert first.tolist() == [2.0, 4.0] and second.tolist() == [6.0, 8.0, 10.0]
