"""Each rank's record of its last collectives, in a file that outlives the process (a flight recorder).

When ranks stop agreeing on which collective comes next (one rank gathers a module the other
skipped), the backend hangs or aborts the process: gloo's `EnforceNotMet ... Is there a distributed
collective mismatch in your code?` ends in SIGABRT, and no Python cleanup runs. So the record is
never written "at the end": every call is written into a file mapped into memory as it starts and
again when it returns. The kernel's page cache holds what was written whatever kills the process,
and the file is complete on disk once the process is gone.

The file, `collectives-rank<N>.bin` (fixed size, little-endian):
    header   magic, format version, entry size, capacity, rank, world size, process id;
    entries  a ring of `capacity` slots; call number `seq` (0, 1, 2, ... in the order the rank
             issued them) lives in slot seq % capacity, so the file keeps the last `capacity` calls.
Each entry: seq, state (started, or returned), the op (the collective's name, or the one it
emulates), payload and wire bytes (`comm_meter`'s conventions), dtype and shape of the tensor it
moves, the size of its group, monotonic start and return times in nanoseconds (the return time
is 0 while the call has not returned; an asynchronous call returns before its work is done), and
where the rank was: the optimizer step, the engine call (forward, backward, step, or the
harness's own bookkeeping) and the engine's label (nano's phase, unit or bucket).

Phase 1 (writer, in each rank): `CollectiveRecord.open(directory, rank, world_size)` creates the
         file at its full size and maps it; `started(...)` writes a call's entry and returns its
         seq; `returned(seq)` stamps the return time.
Phase 2 (reader, anywhere, no torch): `read_record(path)` turns the file into `RecordedCall` rows in
         call order; `read_records(directory)` reads every rank's.
"""

from __future__ import annotations

import mmap
import os
import struct
import time
from dataclasses import dataclass
from pathlib import Path

MAGIC = b"ZLCOLREC"
VERSION = 1
CAPACITY = 4096  # calls kept per rank: a few steps of a stage-3 run of a large model
HEADER = struct.Struct("<8sIIIiii")  # magic, version, entry size, capacity, rank, world size, pid
HEADER_BYTES = 64
# seq, state, group size, payload, wire, start ns, return ns, step, op, dtype, shape, engine call, label
ENTRY = struct.Struct("<QBxxxIQQQQi24s16s32s16s60s")
STARTED, RETURNED = 1, 2
STATE, STATE_OFFSET = struct.Struct("<B"), 8  # rewritten in place when the call returns
RETURN_TIME, RETURN_TIME_OFFSET = struct.Struct("<Q"), 40
NOT_IN_A_STEP = -1
RECORD_DIRECTORY_ENVIRONMENT = "ZERO_LAB_COLLECTIVE_RECORD"  # the launcher sets it to <run_dir>/logs


def record_path(directory: Path, rank: int) -> Path:
    return Path(directory) / f"collectives-rank{rank}.bin"


def from_environment(environ=os.environ) -> "CollectiveRecord | None":
    """This rank's record in the directory the launcher named (RECORD_DIRECTORY_ENVIRONMENT; None:
    not asked for), the rank and world size torchrun gave."""
    directory = environ.get(RECORD_DIRECTORY_ENVIRONMENT)
    if not directory:
        return None
    return CollectiveRecord.open(Path(directory), int(environ.get("RANK", 0)), int(environ.get("WORLD_SIZE", 1)))


def _text(value: str, size: int) -> bytes:
    return value.encode("utf-8", "replace")[:size]


class CollectiveRecord:
    """Phase 1: one rank's file, mapped for writing."""

    def __init__(self, path: Path, rank: int, world_size: int, capacity: int = CAPACITY):
        self.path, self.capacity = Path(path), capacity
        self.path.parent.mkdir(parents=True, exist_ok=True)
        size = HEADER_BYTES + capacity * ENTRY.size
        descriptor = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.ftruncate(descriptor, size)  # zeros: every slot empty
            self._map = mmap.mmap(descriptor, size)
        finally:
            os.close(descriptor)  # the mapping keeps the file
        self._map[:HEADER.size] = HEADER.pack(MAGIC, VERSION, ENTRY.size, capacity, rank, world_size, os.getpid())
        self.next_seq = 0

    @classmethod
    def open(cls, directory: Path, rank: int, world_size: int, capacity: int = CAPACITY) -> "CollectiveRecord":
        return cls(record_path(directory, rank), rank, world_size, capacity)

    def _offset(self, seq: int) -> int:
        return HEADER_BYTES + (seq % self.capacity) * ENTRY.size

    def started(self, op: str, payload_bytes: int, wire_bytes: int, dtype: str, shape: str, group_size: int,
                step: int, call: str, label: str) -> int:
        """Write a call as it starts; its seq."""
        seq = self.next_seq
        self.next_seq += 1
        ENTRY.pack_into(self._map, self._offset(seq), seq, STARTED, group_size, payload_bytes, wire_bytes,
                        time.monotonic_ns(), 0, step, _text(op, 24), _text(dtype, 16), _text(shape, 32),
                        _text(call, 16), _text(label, 60))
        return seq

    def returned(self, seq: int) -> None:
        """Stamp the return time of call `seq` (unless the ring has moved past it)."""
        if seq < self.next_seq - self.capacity:
            return
        offset = self._offset(seq)
        RETURN_TIME.pack_into(self._map, offset + RETURN_TIME_OFFSET, time.monotonic_ns())
        STATE.pack_into(self._map, offset + STATE_OFFSET, RETURNED)

    def close(self) -> None:
        """Unmap the file (what was written stays in it)."""
        self._map.close()


@dataclass(frozen=True)
class RecordedCall:
    """One call as a rank recorded it (Phase 2)."""

    seq: int
    op: str
    payload_bytes: int
    wire_bytes: int
    dtype: str
    shape: str
    group_size: int
    start_ns: int
    end_ns: int | None  # None: it had not returned when the process stopped
    step: int | None  # None: outside the optimizer steps
    call: str
    label: str

    @property
    def returned(self) -> bool:
        return self.end_ns is not None

    def where(self) -> str:
        """Where the rank was: 'step 2 forward, unit vision'."""
        place = " ".join(part for part in (f"step {self.step}" if self.step is not None else "", self.call) if part)
        return ", ".join(part for part in (place, self.label) if part)


@dataclass(frozen=True)
class Record:
    """One rank's file: who wrote it, and the calls it kept, in call order."""

    rank: int
    world_size: int
    pid: int
    calls: list[RecordedCall]
    issued: int  # calls the rank issued in all (more than len(calls) when the ring wrapped)


class NotARecord(ValueError):
    """A file that is not a collective record (wrong magic or version, or cut short)."""


def _decoded(raw: bytes) -> str:
    return raw.rstrip(b"\0").decode("utf-8", "replace")


def read_record(path: Path) -> Record:
    """Phase 2: the calls a rank's file holds, oldest first."""
    data = Path(path).read_bytes()
    if len(data) < HEADER.size or data[:8] != MAGIC:
        raise NotARecord(f"{path} is not a collective record")
    _, version, entry_size, capacity, rank, world_size, pid = HEADER.unpack_from(data)
    if version != VERSION or entry_size != ENTRY.size or len(data) < HEADER_BYTES + capacity * entry_size:
        raise NotARecord(f"{path}: record format {version} with {entry_size}-byte entries, cut short or not this "
                         f"zero-lab's ({VERSION}, {ENTRY.size})")
    calls = []
    for slot in range(capacity):
        (seq, state, group_size, payload, wire, start, end, step, op, dtype, shape, call,
         label) = ENTRY.unpack_from(data, HEADER_BYTES + slot * entry_size)
        if state not in (STARTED, RETURNED):
            continue
        calls.append(RecordedCall(seq, _decoded(op), payload, wire, _decoded(dtype), _decoded(shape), group_size,
                                  start, end if state == RETURNED else None, None if step == NOT_IN_A_STEP else step,
                                  _decoded(call), _decoded(label)))
    calls.sort(key=lambda item: item.seq)
    return Record(rank, world_size, pid, calls, calls[-1].seq + 1 if calls else 0)


def read_records(directory: Path) -> dict[int, Record]:
    """Every rank's record in `directory` ({} when none was written)."""
    records = {}
    for path in sorted(Path(directory).glob("collectives-rank*.bin")):
        record = read_record(path)
        records[record.rank] = record
    return records
