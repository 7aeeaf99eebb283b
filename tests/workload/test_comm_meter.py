"""The comm meter counts calls and bytes per collective by the documented convention."""

import socket

import pytest
import torch
import torch.distributed as dist

from zero_lab.nano.collectives import EMULATED_COLLECTIVE
from zero_lab.workload.meters.comm_meter import CommMeter, OpCount, difference


@pytest.fixture
def meter():
    """A meter installed around a one-rank gloo group (collectives run for real, nothing is sent)."""
    meter = CommMeter().install()
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    try:
        yield meter
    finally:
        dist.destroy_process_group()
        meter.uninstall()


def test_bytes_follow_the_convention(meter):
    tensor = torch.ones(10)  # 40 bytes
    dist.all_reduce(tensor)
    dist.broadcast(tensor, src=0)
    dist.all_gather([torch.empty(10)], tensor)
    dist.all_gather_into_tensor(torch.empty(10), tensor)
    dist.reduce_scatter_tensor(torch.empty(10), torch.ones(10))
    assert meter.snapshot() == {
        "all_reduce": OpCount(1, 40),
        "broadcast": OpCount(1, 40),
        "all_gather": OpCount(1, 40),
        "all_gather_into_tensor": OpCount(1, 40),
        "reduce_scatter_tensor": OpCount(1, 40),
    }


def test_a_collective_that_calls_another_counts_once(meter):
    dist._all_gather_base(torch.empty(6), torch.ones(6))  # calls all_gather_single
    dist.all_gather_into_tensor(torch.empty(6), torch.ones(6))  # deprecated in 2.13: calls it too
    assert meter.snapshot() == {"all_gather_single": OpCount(1, 24),
                                "all_gather_into_tensor": OpCount(1, 24)}


def test_paused_and_reset_collectives_are_not_counted(meter):
    dist.all_reduce(torch.ones(4))
    before = meter.snapshot()
    with meter.paused():
        dist.all_reduce(torch.ones(100))
    dist.broadcast(torch.ones(2), src=0)
    assert difference(meter.snapshot(), before) == {"broadcast": OpCount(1, 8)}
    meter.reset()
    assert meter.snapshot() == {}


def test_uninstall_restores_torch_distributed():
    original = dist.all_reduce
    meter = CommMeter().install()
    assert dist.all_reduce is not original
    meter.uninstall()
    assert dist.all_reduce is original and dist.distributed_c10d.all_reduce is original


def test_an_emulating_call_counts_under_the_collective_it_implements(meter):
    """nano's gloo reduce-scatter is an all-to-all named reduce_scatter while it runs; the trace
    keeps every call in order."""
    meter.trace = []
    label = EMULATED_COLLECTIVE.set("reduce_scatter")
    try:
        dist.all_to_all_single(torch.empty(6), torch.ones(6))
    finally:
        EMULATED_COLLECTIVE.reset(label)
    dist.all_to_all_single(torch.empty(3), torch.ones(3))
    assert meter.snapshot() == {"reduce_scatter": OpCount(1, 24), "all_to_all_single": OpCount(1, 12)}
    assert meter.trace == [("reduce_scatter", 24, 0), ("all_to_all_single", 12, 0)], "one rank sends nothing"
