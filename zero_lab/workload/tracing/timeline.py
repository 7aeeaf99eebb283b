"""One rank's timeline of the traced steps, written in Chrome's trace-event format (`--trace`).

Perfetto, chrome://tracing and Holistic Trace Analysis open `trace-rank<N>.json`; docs/trace.md
says what each track holds. Everything comes from the meters that already watch every impl the
same way, plus nano's own moments, watched from outside the engine (`nano_moments`):
    step track         a span per traced optimizer step ("ProfilerStep#<k>", torch.profiler's name,
                       by which HTA numbers iterations), inside it a span per engine call
                       (forward, backward, optimizer step: the `StepPhase` the training loop
                       moves), inside those the optimizer's own step (every impl: torch's optimizer
                       hooks), autograd's own run inside the backward (`autograd_moments`: what
                       a collective issued in the backward can overlap), nano's labelled regions (`nano_moments`: the optimizer step's
                       phases, each gradient bucket, each stage-3 gather) and official's own
                       phases of the optimizer step (`deepspeed_moments`: its ZeRO optimizer's
                       timers, `optimizer_gradients`, `optimizer_step`, `optimizer_allgather`);
    collectives        a span per collective the communication meter counts, from its call to
                       its return, with op, payload and wire bytes, dtype, shape, group size and
                       nano's label (unit or bucket) in `args`; an asynchronous call (one that
                       returns a work handle) is drawn to when its work completed, on tracks of its
                       own: one more track for each call still in flight when another starts, so no
                       two spans on a track overlap (Perfetto draws only nested slices);
    unit tracks        stage 3 (nano): a span per unit while it is whole, gathered to released;
    memory counter     allocated bytes at every change, split by the engine call each storage was
                       made in ("before" for what existed when tracing began); on CPU from the
                       exact meter's tracker, so the track's maximum is the run's measured peak; on
                       CUDA the caching allocator's figure at each span's edges;
    metadata           process and thread names, and `distributedInfo` (rank, world size, backend),
                       which HTA reads to know whose trace it is.
Times are the host's monotonic clock in microseconds, the same clock on every rank of one machine.

Phase 1: `start_tracing` hooks the timeline into the step phase, the comm meter, nano's moments
         and the memory meter; nothing is recorded until a traced step begins.
Phase 2: the steps run; only those in the request's steps are recorded, each completely (a later
         step ends the recording of memory and collectives until another traced step begins).
Phase 3: `close` writes the trace and the memory snapshot (`memory_history`) and unhooks all; the
         trace says which traced steps it recorded and by which attempt (`--max-restarts`), and an
         attempt that recorded none (it resumed after them) leaves an earlier attempt's files.
"""

from __future__ import annotations

import json
import pickle
import sys
import time
from time import monotonic_ns

import torch
import torch.distributed as dist

from zero_lab.nano import collectives
from zero_lab.workload.faults.rank_pause import restart_attempt
from zero_lab.workload.tracing import autograd_moments, deepspeed_moments
from zero_lab.workload.tracing import nano_moments
from zero_lab.workload.tracing.memory_history import AllocationHistory, CudaHistory, captured_stack
from zero_lab.workload.step_phase import Phase, StepPhase
from zero_lab.workload.tracing.trace_settings import TraceRequest, snapshot_path, trace_path

SPAN_NAMES = {Phase.FORWARD: "forward", Phase.BACKWARD: "backward", Phase.STEP: "optimizer step"}
STEP_SPAN = "ProfilerStep#"  # torch.profiler's name for a step: HTA numbers its iterations by it
BEFORE = "before"  # the memory category of storages that existed when tracing began
MEMORY_COUNTER = "allocated bytes"
WINDOW = object()  # the memory log's mark of a traced window opening
REGION_CATEGORIES = {"label": "nano", "optimizer": "optimizer", "deepspeed": "deepspeed",  # observed kind -> category
                     "autograd": "autograd"}
# Thread ids of the tracks (units follow UNIT_TRACKS, one each).
STEP_TRACK, COLLECTIVE_TRACK, ASYNC_COLLECTIVE_TRACK, UNIT_TRACKS = 1, 2, 3, 10
ASYNC_LANES = 1000  # asynchronous collectives in flight together: lane k (k >= 1) on track ASYNC_LANES + k
TRACK_NAMES = {STEP_TRACK: "step", COLLECTIVE_TRACK: "collectives",
               ASYNC_COLLECTIVE_TRACK: "collectives (asynchronous)"}


def now_us() -> float:
    return time.monotonic_ns() / 1000


class Timeline:
    """Phase 2's recorder for one rank."""

    def __init__(self, request: TraceRequest, device: torch.device, rank: int):
        self.request, self.device, self.rank = request, device, rank
        self.events: list[tuple] = []  # spans ("X", ...) and CUDA samples ("C", ...), made dicts when written
        self.active = False  # inside a traced step's window: memory and collectives recorded
        self.step: int | None = None  # the traced step open now
        self.step_start = self.last_phase_end = 0.0
        self.span: tuple[str, float] | None = None  # the engine call open now
        self.labels: list[tuple[str, float]] = []
        self.units: dict[str, float] = {}
        self.unit_tracks: dict[str, int] = {}
        # Every change the CPU tracker reported inside a window, as little as possible taken in the step:
        # (time in ns, key, bytes added, size after (None: freed), the engine call's span open then, its stack),
        # and at each window's opening (WINDOW, time, bytes alive, each storage's bytes). Replayed when
        # the files are written (`_replay_memory`).
        self.memory_log: list[tuple] = []
        self.cpu_history = AllocationHistory() if device.type != "cuda" else None
        self.cuda_history = CudaHistory(device) if device.type == "cuda" else None
        self.tracker = None
        self.world = (1, "none")  # world size and backend, read when the first traced step begins
        self.unwatch_deepspeed = None  # official's optimizer timers, watched from the first traced step

    # ----- the step phase -------------------------------------------------------------------
    def follow(self, phase: StepPhase) -> None:
        """The training loop entered a phase: close the open span, and open the next if traced."""
        now = now_us()
        self._close_span(now)
        if phase.current not in SPAN_NAMES:
            return
        if phase.step not in self.request.steps:
            self._close_step()
            self._set_active(False)
            return
        if self.step != phase.step:
            self._close_step()
            self.step, self.step_start = phase.step, now
            self._set_active(True)
        self.span = (SPAN_NAMES[phase.current], now)

    def _close_span(self, now: float) -> None:
        if self.span is not None:
            name, start = self.span
            self._complete(name, "phase", start, now, STEP_TRACK, {"step": self.step})
            self.span, self.last_phase_end = None, now

    def _close_step(self) -> None:
        if self.step is not None:
            self._complete(f"{STEP_SPAN}{self.step}", "step", self.step_start, self.last_phase_end, STEP_TRACK,
                           {"step": self.step})
            self.step = None

    def _set_active(self, active: bool) -> None:
        if active and not self.active:
            if dist.is_available() and dist.is_initialized():  # a script may destroy its group before `close`
                self.world = (dist.get_world_size(), str(dist.get_backend()))
            if self.tracker is not None:  # what exists now counts as "before", whenever it was made
                self.memory_log.append((WINDOW, monotonic_ns(), self.tracker.running_bytes,
                                        self.tracker.live_storage_bytes()))
            if self.cuda_history is not None and self.cuda_history.result is None:
                self.cuda_history.start()
            if self.unwatch_deepspeed is None:  # an official run has loaded DeepSpeed by now
                self.unwatch_deepspeed = deepspeed_moments.watch(self.observe_engine)
        if not active and self.active and self.cuda_history is not None:
            self.cuda_history.stop()
        self.active = active

    # ----- nano's moments -------------------------------------------------------------------
    def observe_engine(self, kind: str, name: str, begins: bool) -> None:
        now = now_us()
        if kind in REGION_CATEGORIES:
            if name.endswith(" "):  # "unit " or "prefetch " of nothing: no region to show
                return
            if begins and self.active:
                self.labels.append((name, now))
            elif not begins and self.labels and self.labels[-1][0] == name:
                self._complete(name, REGION_CATEGORIES[kind], self.labels.pop()[1], now, STEP_TRACK, {"step": self.step})
        elif kind == "unit":
            if begins and self.active:
                self.units.setdefault(name, now)
            elif not begins and name in self.units:
                track = self.unit_tracks.setdefault(name, UNIT_TRACKS + len(self.unit_tracks))
                self._complete(f"unit {name}", "unit", self.units.pop(name), now, track, {"unit": name})
        if self.cuda_history is not None:
            self._sample_cuda_memory(now)

    # ----- the comm meter -------------------------------------------------------------------
    def collective_started(self, op: str, payload: int, wire: int, dtype: str, shape: str, group_size: int):
        """A counted call starts: its span's fields (None outside a traced step)."""
        if not self.active:
            return None
        args = {"op": op, "payload_bytes": payload, "wire_bytes": wire, "dtype": dtype, "shape": shape,
                "group_size": group_size, "label": collectives.COLLECTIVE_LABEL.get(None) or "", "step": self.step}
        return args, now_us()

    def collective_returned(self, span, result) -> None:
        args, start = span
        future = None
        if result is not None and hasattr(result, "get_future"):
            try:
                future = result.get_future()
            except RuntimeError:  # a backend without futures for this op: drawn to its return
                future = None
        if future is None:
            self._complete(args["op"], "collective", start, now_us(), COLLECTIVE_TRACK, args)
            return
        args["asynchronous"] = True

        def completed(_):
            self._complete(args["op"], "collective", start, now_us(), ASYNC_COLLECTIVE_TRACK, args)

        future.then(completed)

    # ----- memory ---------------------------------------------------------------------------
    def memory_changed(self, key: int, added: int, running: int, storage) -> None:
        """The CPU tracker's listener: every allocation, resize and free. Inside the step only what
        cannot be known later is kept (the time, the size, the open span, the stack)."""
        if not self.active:
            return
        if storage is None:
            self.memory_log.append((monotonic_ns(), key, added, None, None, None))
            return
        size = storage.nbytes()
        self.memory_log.append((monotonic_ns(), key, added, size, self.span, captured_stack() if size > 0 else None))

    def _replay_memory(self) -> list[tuple[float, str | None, int]]:
        """The log in order, once, when the files are written: (time, category, bytes added) per change
        for the counter (category None: a window opens, all of it "before"), each storage's category the
        engine call it was made in; and the snapshot's events, into `cpu_history`."""
        changes, category_of = [], {}
        for entry in self.memory_log:
            if entry[0] is WINDOW:
                _, when, running, live = entry
                changes.append((when / 1000, None, running))
                category_of = {}
                self.cpu_history.window_opened(live)
                continue
            when, key, added, size, span, stack = entry
            when /= 1000  # the log keeps nanoseconds, the trace microseconds
            category = category_of.get(key, BEFORE)
            if size is not None and key not in category_of and added == size:
                category = span[0] if span is not None else "between steps"
                category_of[key] = category
            elif size is None:
                category_of.pop(key, None)
            changes.append((when, category, added))
            self.cpu_history.changed(key, added, size or 0, when, stack)
        return changes

    def memory_counter(self, changes: list[tuple[float, str | None, int]]) -> list[dict]:
        """The counter track's events, from the replayed changes: the bytes of each category after each one."""
        events, categories = [], {}
        for when, category, added in changes:
            if category is None:
                categories = {BEFORE: added}
            else:
                categories[category] = categories.get(category, 0) + added
            events.append({"ph": "C", "name": MEMORY_COUNTER, "pid": self.rank, "ts": when, "args": dict(categories)})
        return events

    def _sample_cuda_memory(self, now: float) -> None:
        if self.cuda_history is not None and self.active:
            self.events.append(("C", now, torch.cuda.memory_allocated(self.device)))

    # ----- the file -------------------------------------------------------------------------
    def _complete(self, name: str, category: str, start: float, end: float, track: int, args: dict) -> None:
        """A span, kept as a tuple inside the step; `trace_events` makes it the format's dict."""
        self.events.append(("X", name, category, start, end, track, args))
        if self.cuda_history is not None:
            self._sample_cuda_memory(end)

    def async_lanes(self) -> dict[int, int]:
        """A track for each asynchronous collective such that no two on one track overlap: Perfetto
        draws only nested slices on a track, and these overlap in part (a bucket's reduce-scatter still
        in flight when the next starts). Each takes the first lane free at its start, in start order:
        {index in `events`: its track}; lane 0 is ASYNC_COLLECTIVE_TRACK, lane k ASYNC_LANES + k."""
        lanes: list[float] = []  # each lane's last end
        placed = {}
        spans = sorted((event[3], index) for index, event in enumerate(self.events)
                       if event[0] == "X" and event[5] == ASYNC_COLLECTIVE_TRACK)
        for start, index in spans:
            lane = next((number for number, end in enumerate(lanes) if end <= start), len(lanes))
            if lane == len(lanes):
                lanes.append(0.0)
            lanes[lane] = self.events[index][4]
            placed[index] = ASYNC_COLLECTIVE_TRACK if lane == 0 else ASYNC_LANES + lane
        return placed

    def trace_events(self) -> list[dict]:
        """The spans and CUDA memory samples in Chrome's trace-event format."""
        made, lanes = [], self.async_lanes()
        for index, event in enumerate(self.events):
            if event[0] == "X":
                _, name, category, start, end, track, args = event
                track = lanes.get(index, track)
                made.append({"ph": "X", "name": name, "cat": category, "pid": self.rank, "tid": track, "ts": start,
                             "dur": max(0.0, end - start), "args": args})
            else:
                made.append({"ph": "C", "name": MEMORY_COUNTER, "pid": self.rank, "ts": event[1],
                             "args": {"allocated": event[2]}})
        return made

    def document(self, world_size: int, backend: str, changes: list[tuple[float, str | None, int]]) -> dict:
        """The whole trace: metadata, then the events (the memory counter from the replayed `changes`) in time order."""
        lanes = sorted(set(self.async_lanes().values()) - {ASYNC_COLLECTIVE_TRACK})
        names = {**TRACK_NAMES, **{track: f"unit {unit}" for unit, track in self.unit_tracks.items()},
                 **{track: f"{TRACK_NAMES[ASYNC_COLLECTIVE_TRACK]} {track - ASYNC_LANES + 1}" for track in lanes}}
        metadata = [{"ph": "M", "name": "process_name", "pid": self.rank, "tid": 0, "args": {"name": f"rank {self.rank}"}},
                    {"ph": "M", "name": "process_sort_index", "pid": self.rank, "tid": 0, "args": {"sort_index": self.rank}}]
        metadata += [{"ph": "M", "name": "thread_name", "pid": self.rank, "tid": track, "args": {"name": name}}
                     for track, name in sorted(names.items())]
        events = sorted(self.trace_events() + self.memory_counter(changes), key=lambda event: event["ts"])
        return {"schemaVersion": 1, "distributedInfo": {"rank": self.rank, "world_size": world_size, "backend": backend},
                "deviceProperties": [], "displayTimeUnit": "ms", "traceSteps": sorted(self.request.steps),
                # what this file holds: the traced steps recorded, by which attempt of the job (--max-restarts)
                "recordedSteps": self.recorded_steps(), "attempt": restart_attempt(),
                "traceEvents": metadata + events}

    def recorded_steps(self) -> list[int]:
        """The traced steps this attempt recorded (a restarted one that resumed after them records none)."""
        return sorted({event[6]["step"] for event in self.events if event[0] == "X" and event[2] == "step"})

    def write(self, world_size: int, backend: str, live_storages: dict[int, int] | None) -> None:
        """The trace and the snapshot; an attempt that recorded no traced step leaves an earlier
        attempt's files as they are (torchrun restarted the workers after the traced steps) and says so."""
        directory = self.request.directory
        directory.mkdir(parents=True, exist_ok=True)
        attempt = restart_attempt()
        if not self.recorded_steps() and trace_path(directory, self.rank).is_file():
            print(f"trace: attempt {attempt} recorded none of the traced steps (it resumed after them); "
                  f"{trace_path(directory, self.rank).name} keeps an earlier attempt's", file=sys.stderr, flush=True)
            return
        changes = self._replay_memory()  # the counter's changes; the CPU snapshot's events, into cpu_history
        with open(trace_path(directory, self.rank), "w") as file:
            json.dump(self.document(world_size, backend, changes), file)
        snapshot = (self.cpu_history.snapshot(live_storages or {}) if self.cpu_history is not None
                    else self.cuda_history.result)
        if snapshot is not None:
            with open(snapshot_path(directory, self.rank), "wb") as file:
                pickle.dump(snapshot, file)


class Tracing:
    """Phases 1 and 3: the hooks of one rank's timeline, put in and taken out."""

    def __init__(self, timeline: Timeline, comm, memory, phase: StepPhase):
        self.timeline, self.comm, self.memory, self.phase = timeline, comm, memory, phase
        phase.observers.append(timeline.follow)
        comm.timeline = timeline
        self.unwatch = nano_moments.watch(timeline.observe_engine)
        self.unwatch_autograd = autograd_moments.watch(timeline.observe_engine)
        tracker = getattr(memory, "tracker", None)
        if tracker is not None:
            timeline.tracker = tracker
            tracker.listener = timeline.memory_changed

    def close(self) -> None:
        """Phase 3: end the open spans, unhook, write the files."""
        timeline = self.timeline
        timeline._close_span(now_us())
        timeline._close_step()
        timeline._set_active(False)
        if timeline.follow in self.phase.observers:
            self.phase.observers.remove(timeline.follow)
        self.comm.timeline = None
        self.unwatch()
        self.unwatch_autograd()
        if timeline.unwatch_deepspeed is not None:
            timeline.unwatch_deepspeed()
        live = None
        if timeline.tracker is not None:
            timeline.tracker.listener = None
            live = timeline.tracker.live_storage_bytes()
        timeline.write(*timeline.world, live)


def start_tracing(request: TraceRequest | None, comm, memory, phase: StepPhase, device: torch.device,
                  rank: int) -> Tracing | None:
    """Phase 1 (None: no --trace)."""
    if request is None:
        return None
    return Tracing(Timeline(request, device, rank), comm, memory, phase)
