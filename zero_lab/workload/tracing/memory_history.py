"""Every allocation and free of a traced window, as the memory snapshot viewer reads them.

On CUDA, torch's caching allocator keeps this history itself (`torch.cuda.memory.
_record_memory_history`) and `_snapshot()` returns it. On CPU there is no allocator to ask, so this
module builds the same dict from the exact meter's tracker (`memory_meter.LiveStorageTracker`):
    segments       one per storage alive when the window closes (a CPU storage is its own
                   allocation: one segment holding one block, `active_allocated`), with the
                   frames of its allocation when it was made inside the window;
    device_traces  one list (device 0: the CPU) of the window's events in order: `alloc` (size,
                   the Python frames that made it), `free_requested` then `free_completed` (a CPU
                   free is immediate); a storage resized in place is a free of its old size and an
                   alloc of its new one.
An address is the storage's identity in the tracker (its Python object's id), unique among the
storages alive at one time, which is all the viewer asks of an address.

Phase 1: while a window is open the timeline keeps, per change the tracker reports, only its time,
         sizes and `captured_stack()` (the hot path: nothing else is done inside the step).
Phase 2: when the files are written, the timeline replays those changes in order into
         `window_opened(...)` and `changed(...)`, which make the events.
Phase 3: `snapshot(live)` returns the dict; `python -m torch.cuda._memory_viz trace_plot FILE`
         draws it like a CUDA run's.
"""

from __future__ import annotations

import torch
from torch._C._profiler import gather_traceback, symbolize_tracebacks

TRACKER_FILES = ("memory_meter.py", "memory_history.py", "timeline.py", "_python_dispatch.py", "_ops.py")
FRAME_LIMIT = 16  # frames kept per allocation, innermost first (the viewer shows the innermost)


def captured_stack():
    """The Python stack where the allocation happens, taken by torch's own stack walker in C++ (the
    one `_record_memory_history` uses on CUDA; about a third of the cost of walking the frames in
    Python): a handle holding code objects and lines, made into frames only when the snapshot is
    written."""
    return gather_traceback(python=True, script=False, cpp=False)


def frame_lists(stacks: list) -> list[list[dict]]:
    """Each captured stack as the viewer's frames (filename, line, name), innermost first, without the
    tracker's own frames, at most FRAME_LIMIT of them (the viewer shows the innermost)."""
    symbolized = symbolize_tracebacks(stacks) if stacks else []
    return [[frame for frame in stack if not frame["filename"].endswith(TRACKER_FILES)][:FRAME_LIMIT]
            for stack in symbolized]


class AllocationHistory:
    """One rank's events in the snapshot's shape (Phase 1), and the snapshot itself (Phase 2)."""

    def __init__(self) -> None:
        self.events: list[tuple] = []
        self.sizes: dict[int, int] = {}  # key -> bytes, for the storages allocated inside the window
        self.stacks: dict[int, object] = {}  # key -> the captured stack of its allocation

    def window_opened(self, live_sizes: dict[int, int]) -> None:
        """A traced window opens with `live_sizes` (key -> bytes) alive: a storage allocated in an
        earlier window and freed between windows is forgotten (its key may name another by now)."""
        self.sizes = {key: live_sizes[key] for key in self.sizes if key in live_sizes}

    def changed(self, key: int, added: int, new_size: int, now_us: float, stack) -> None:
        """Storage `key` grew by `added` bytes (negative: shrank) to `new_size` (0: freed) at `now_us`,
        made at `stack` (None when it shrank or was freed). Events are kept as tuples (action, key,
        size, time, stack) until the snapshot is written."""
        old_size = self.sizes.pop(key, None)
        if old_size is None:  # made before the window opened: its size before this change
            old_size = new_size - added
        if old_size > 0:
            self.events.append(("free_requested", key, old_size, now_us, None))
            self.events.append(("free_completed", key, old_size, now_us, None))
        if new_size > 0:
            self.sizes[key], self.stacks[key] = new_size, stack
            self.events.append(("alloc", key, new_size, now_us, stack))

    def snapshot(self, live_storages: dict[int, int]) -> dict:
        """Phase 2: `live_storages` (key -> bytes: the tracker's storages alive now) as segments, and the events."""
        live = [(key, size) for key, size in sorted(live_storages.items()) if size > 0]
        stacks = [stack for *_, stack in self.events if stack is not None]
        stacks += [self.stacks[key] for key, _ in live if key in self.stacks]
        frames_of = dict(zip(map(id, stacks), frame_lists(stacks)))
        segments = []
        for key, size in live:
            frames = frames_of.get(id(self.stacks.get(key)), [])
            block = {"address": key, "size": size, "requested_size": size, "state": "active_allocated",
                     "frames": frames}
            segments.append({"device": 0, "address": key, "total_size": size, "allocated_size": size,
                             "active_size": size, "requested_size": size, "stream": 0, "segment_type": "large",
                             "segment_pool_id": (0, 0), "is_expandable": False, "frames": frames,
                             "blocks": [block]})
        events = [{"action": action, "addr": key, "size": size, "stream": 0, "time_us": int(when),
                   "frames": frames_of.get(id(stack), []) if stack is not None else []}
                  for action, key, size, when, stack in self.events]
        return {"segments": segments, "device_traces": [events], "allocator_settings": {},
                "external_annotations": [], "device": "cpu"}


class CudaHistory:
    """The same history on CUDA: torch's own recording, started and read around the window."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.recording = False
        self.result: dict | None = None

    def start(self) -> None:
        torch.cuda.memory._record_memory_history(max_entries=1_000_000, device=self.device)
        self.recording = True

    def stop(self) -> None:
        if self.recording:
            self.result = torch.cuda.memory._snapshot(self.device)
            torch.cuda.memory._record_memory_history(enabled=None, device=self.device)
            self.recording = False
