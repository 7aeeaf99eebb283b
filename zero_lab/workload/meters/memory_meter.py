"""Memory measured the same way for every engine: live tensor bytes, their peak, and the process's
resident or reserved memory, read from outside the engine so neither impl grades itself.

On CUDA the caching allocator already keeps these figures (`torch.cuda.memory_allocated` and
friends). On CPU there is no allocator to ask, so `LiveStorageTracker` watches every aten op's
outputs through a `TorchDispatchMode` and remembers each untyped storage by weak reference: a
storage counts from the first op that produces it until it is freed. Process RSS alone is no
substitute: some 800 MB of library baseline hides the stage differences.

The tracker only sees storages produced while it is active, so enter it before building the model.
A storage can also shrink or grow in place without any op (`untyped_storage().resize_(0)`, the
way FSDP2 and nano free a buffer that other references still point to): while active, the
tracker follows those resizes too, and `live_bytes` re-reads every storage's size when asked.
A tensor subclass that wraps others (FSDP2's DTensor) counts as the storages of the tensors it
wraps: its own storage has the whole tensor's size but holds nothing.

Both meters count garbage too: a tensor kept by an unreachable reference cycle lives until
Python's cyclic collector runs, at a moment that depends on allocation counts, not on the step
(seen: gloo's reduce-scatter keeps a whole-input copy alive through its work object, sometimes).
So the meter collects garbage before it reads the live bytes; peaks within a step may still
include garbage that has not been collected yet. A full collection walks every object Python
tracks, and after torch, transformers and an engine are imported that is about half a second per
sample on a 2-core machine (20 samples for 5 steps: more than the steps). So once the engine is
built, `MemoryMeter.freeze_survivors()` collects once and moves every survivor to the permanent
generation (`gc.freeze`, what CPython offers for this): later collections walk only what the
steps create, which is where a step's garbage comes from. Reference counting still frees frozen
objects, and `stop()` gives them back to the collector (`gc.unfreeze`), for in-process callers.

Phase 1: `MemoryMeter.start()` enters the tracker (CPU) or resets CUDA's peak statistics.
Phase 2: the training step runs; every new storage raises `live_bytes` and possibly `peak_bytes`.
Phase 3: `MemoryMeter.sample()` returns a `MemorySample` and resets the peaks for the next step.
"""

from __future__ import annotations

import functools
import gc
import resource
import weakref
from dataclasses import dataclass

import psutil
import torch
from torch.utils._python_dispatch import TorchDispatchMode, is_traceable_wrapper_subclass
from torch.utils._pytree import tree_leaves


@dataclass(frozen=True)
class MemorySample:
    """One rank's memory at the end of a step, in bytes (peaks are since the previous sample)."""

    alloc: int
    reserved: int
    peak_alloc: int
    peak_reserved: int


class LiveStorageTracker(TorchDispatchMode):
    """Bytes of tensor storage alive in this process on one device type, and their peak.

    torch keeps one Python object per live storage (PyObject preservation), so a weak reference
    to it fires its callback exactly when the storage is freed: frees are counted as they happen,
    with no scan over the storages. A running total follows every allocation, free and resize
    for the peak; `live_bytes` reads each storage's size at the moment it is asked, so a resize
    made where no hook sees it can never leave a stale figure behind.
    """

    def __init__(self, device_type: str = "cpu"):
        super().__init__()
        self.device_type = device_type
        self._storages: dict[int, tuple[weakref.ref, int]] = {}  # id(storage) -> (ref, bytes last seen)
        self._running_bytes = 0
        self.peak_bytes = 0
        self._original_resize = None
        # Told every change of the running total: listener(storage key, bytes added (negative: freed),
        # running total, the storage or None when freed) (a timeline's memory track: `--trace`).
        self.listener = None

    def __enter__(self):
        self._original_resize = torch.UntypedStorage.resize_
        original = self._original_resize

        def resize_and_observe(storage, size):
            result = original(storage, size)
            self._observe_storage(storage)
            return result

        torch.UntypedStorage.resize_ = resize_and_observe
        return super().__enter__()

    def __exit__(self, *exc):
        torch.UntypedStorage.resize_ = self._original_resize
        return super().__exit__(*exc)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for leaf in tree_leaves(out):
            if isinstance(leaf, torch.Tensor) and leaf.device.type == self.device_type:
                self._observe(leaf)
        return out

    def _observe(self, tensor: torch.Tensor) -> None:
        if is_traceable_wrapper_subclass(tensor):
            # A wrapper (FSDP2's DTensor) reports a storage the size of the whole tensor that holds
            # no data; the bytes live in its inner tensors (a DTensor's local shard).
            for name in tensor.__tensor_flatten__()[0]:
                inner = getattr(tensor, name)
                if isinstance(inner, torch.Tensor):
                    self._observe(inner)
            return
        try:
            storage = tensor.untyped_storage()
        except (NotImplementedError, RuntimeError):  # sparse and other storage-less layouts
            return
        self._observe_storage(storage)

    def _observe_storage(self, storage: torch.UntypedStorage) -> None:
        if storage.device.type != self.device_type:
            return
        key, nbytes = id(storage), storage.nbytes()
        known = self._storages.get(key)
        if known is None:
            self._storages[key] = (weakref.ref(storage, functools.partial(self._freed, key)), nbytes)
            self._running_bytes += nbytes
        elif known[1] != nbytes:  # resized in place (resize_, set_, storage resize)
            self._storages[key] = (known[0], nbytes)
            self._running_bytes += nbytes - known[1]
        else:
            return
        self.peak_bytes = max(self.peak_bytes, self._running_bytes)
        if self.listener is not None:
            self.listener(key, nbytes - (known[1] if known is not None else 0), self._running_bytes, storage)

    def _freed(self, key: int, _ref) -> None:
        freed = self._storages.pop(key)[1]
        self._running_bytes -= freed
        if self.listener is not None:
            self.listener(key, -freed, self._running_bytes, None)

    @property
    def live_bytes(self) -> int:
        """Bytes of every tracked storage alive now, each sized as it is at this moment."""
        for key, (reference, seen) in list(self._storages.items()):
            storage = reference()
            if storage is not None and storage.nbytes() != seen:
                self._storages[key] = (reference, storage.nbytes())
                self._running_bytes += storage.nbytes() - seen
        return self._running_bytes

    def reset_peak(self) -> None:
        self.peak_bytes = self.live_bytes

    @property
    def running_bytes(self) -> int:
        """The running total the peak follows (sizes as last seen, no re-reading)."""
        return self._running_bytes

    def live_storage_bytes(self) -> dict[int, int]:
        """Each storage alive now, by its key, with its bytes as last seen."""
        return {key: size for key, (reference, size) in list(self._storages.items()) if reference() is not None}


def resident_bytes() -> int:
    """The process's resident set size now."""
    return psutil.Process().memory_info().rss


def peak_resident_bytes() -> int:
    """The process's resident high-water mark (VmHWM) since the last `reset_peak_resident`."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # non-Linux: lifetime peak


def reset_peak_resident() -> None:
    """Linux resets VmHWM to the current RSS when "5" is written to clear_refs; elsewhere no-op."""
    try:
        with open("/proc/self/clear_refs", "w") as clear_refs:
            clear_refs.write("5")
    except OSError:
        pass


class MemoryMeter:
    """Per-step memory of one rank: the caching allocator's statistics on CUDA, else a tracker+RSS."""

    def __init__(self, device: torch.device):
        self.device = device
        self.tracker = LiveStorageTracker(device.type) if device.type != "cuda" else None
        self.tracking = False
        self.frozen = False

    def start(self) -> None:
        if self.tracker is not None:
            self.tracker.__enter__()
            self.tracking = True
            reset_peak_resident()
        else:
            torch.cuda.reset_peak_memory_stats(self.device)

    def freeze_survivors(self) -> None:
        """Collect garbage once, then leave every surviving object out of later collections until
        `stop()` (see the module docstring): after the engine is built, before the first step."""
        gc.collect()
        gc.freeze()
        self.frozen = True

    def stop(self) -> None:
        """Leave the tracker and give frozen objects back to the collector (once each; a second
        stop does nothing)."""
        if self.tracking:
            self.tracker.__exit__(None, None, None)
            self.tracking = False
        if self.frozen:
            gc.unfreeze()
            self.frozen = False

    def live_bytes(self) -> int:
        """Bytes of live tensors now (CUDA: allocated), without touching the peaks."""
        gc.collect()
        if self.tracker is None:
            return torch.cuda.memory_allocated(self.device)
        return self.tracker.live_bytes

    def resident_beside_tensors(self) -> int | None:
        """What the process holds resident beside its live tensors now (the interpreter, its libraries,
        the engine, the allocator's own); None on CUDA, whose tensors are not in the resident set."""
        if self.tracker is None:
            return None
        return resident_bytes() - self.live_bytes()

    def peak_bytes(self) -> int:
        """The peak of live tensor bytes since the previous sample, without resetting it."""
        if self.tracker is None:
            return torch.cuda.max_memory_allocated(self.device)
        return self.tracker.peak_bytes

    def sample(self) -> MemorySample:
        """The memory now and the peaks since the previous sample; then reset the peaks."""
        gc.collect()
        if self.tracker is None:
            sample = MemorySample(
                alloc=torch.cuda.memory_allocated(self.device),
                reserved=torch.cuda.memory_reserved(self.device),
                peak_alloc=torch.cuda.max_memory_allocated(self.device),
                peak_reserved=torch.cuda.max_memory_reserved(self.device),
            )
            torch.cuda.reset_peak_memory_stats(self.device)
            return sample
        alloc = self.tracker.live_bytes
        reserved = resident_bytes()
        sample = MemorySample(
            alloc=alloc,
            reserved=reserved,
            peak_alloc=self.tracker.peak_bytes,
            peak_reserved=max(peak_resident_bytes(), reserved),
        )
        self.tracker.reset_peak()
        reset_peak_resident()
        return sample
