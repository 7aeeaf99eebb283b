"""The flight record of collectives: what a rank writes is read back in call order, the ring keeps the
last calls, the file is complete after the process aborts, and the comm meter writes every call
with where the rank was."""

import os
import signal
import socket
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.distributed as dist

from zero_lab.nano.collectives import labelled
from zero_lab.workload.meters.collective_record import (CollectiveRecord, NotARecord, read_record, read_records,
                                                 record_path)
from zero_lab.workload.meters.comm_meter import CommMeter, OpCount
from zero_lab.workload.step_phase import Phase, StepPhase


def test_calls_read_back_in_order_and_the_ring_keeps_the_last(tmp_path):
    record = CollectiveRecord.open(tmp_path, rank=1, world_size=2, capacity=4)
    for seq in range(6):
        started = record.started("all_gather", 100 * seq, 50 * seq, "float32", "2x3", 2, seq, "forward", f"unit {seq}")
        assert started == seq
        if seq != 5:
            record.returned(seq)
    record.returned(0)  # long gone from the ring: nothing to stamp
    record.close()
    read = read_record(record_path(tmp_path, 1))
    assert (read.rank, read.world_size, read.pid, read.issued) == (1, 2, os.getpid(), 6)
    assert [call.seq for call in read.calls] == [2, 3, 4, 5]
    assert [call.payload_bytes for call in read.calls] == [200, 300, 400, 500]
    assert [call.returned for call in read.calls] == [True, True, True, False]
    assert all(call.end_ns >= call.start_ns for call in read.calls[:3])
    assert read.calls[-1].where() == "step 5 forward, unit 5"
    assert read_records(tmp_path).keys() == {1}


def test_a_file_that_is_no_record_is_refused(tmp_path):
    (tmp_path / "collectives-rank0.bin").write_bytes(b"not a record at all")
    with pytest.raises(NotARecord):
        read_records(tmp_path)


def test_the_record_is_complete_after_the_process_aborts(tmp_path):
    """SIGABRT (what gloo's EnforceNotMet ends in) runs no Python cleanup: the calls written before it are in the file."""
    script = textwrap.dedent(f"""
        import os
        from zero_lab.workload.meters.collective_record import CollectiveRecord
        record = CollectiveRecord.open({str(tmp_path)!r}, rank=0, world_size=2)
        for seq in range(3):
            record.started("all_reduce", 4, 4, "float32", "1", 2, 1, "step", "unscale_clip")
            record.returned(seq)
        record.started("all_gather", 64, 32, "bfloat16", "32", 2, 2, "forward", "unit vision")
        os.abort()
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, env={**os.environ}, timeout=120)
    assert done.returncode == -signal.SIGABRT, done.stderr
    read = read_record(record_path(tmp_path, 0))
    assert [(call.op, call.returned) for call in read.calls] == [("all_reduce", True)] * 3 + [("all_gather", False)]
    assert read.calls[-1].where() == "step 2 forward, unit vision" and read.calls[-1].dtype == "bfloat16"


@pytest.fixture
def recorded(tmp_path):
    """A meter writing to a record, installed around a one-rank gloo group."""
    phase = StepPhase()
    record = CollectiveRecord.open(tmp_path, 0, 1)
    meter = CommMeter().install().record_to(record, phase)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    try:
        yield meter, phase, tmp_path
    finally:
        dist.destroy_process_group()
        meter.uninstall()
        record.close()


def test_the_meter_records_every_call_with_where_the_rank_was(recorded):
    meter, phase, directory = recorded
    dist.all_reduce(torch.ones(2, 3))  # start-up
    phase.enter(Phase.FORWARD, 1)
    with labelled("unit layers.0"):
        dist.all_gather_into_tensor(torch.empty(6, dtype=torch.bfloat16), torch.ones(6, dtype=torch.bfloat16))
    phase.enter(Phase.BETWEEN_STEPS)
    with meter.paused():
        dist.all_reduce(torch.ones(1, dtype=torch.float64))
    dist.barrier()
    assert meter.snapshot() == {"all_reduce": OpCount(1, 24), "all_gather_into_tensor": OpCount(1, 12)}
    calls = read_record(record_path(directory, 0)).calls
    rows = [(call.op, call.payload_bytes, call.dtype, call.shape, call.group_size, call.where()) for call in calls]
    assert rows == [("all_reduce", 24, "float32", "2x3", 1, "start-up"),
                    ("all_gather_into_tensor", 12, "bfloat16", "6", 1, "step 1 forward, unit layers.0"),
                    ("all_reduce", 8, "float64", "1", 1, "step 1 harness"),
                    ("barrier", 0, "", "", 1, "step 1 between steps")]
    assert all(call.returned for call in calls)
