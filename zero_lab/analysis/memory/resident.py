"""A CPU rank's resident memory at its peak, predicted: the live tensors `peak_memory` predicts, what the
heap keeps beside them, and what the process holds besides - the interpreter, torch and its libraries,
the engine, its threads' own.

Phase 1: the tensors' peak, less what is allocated and never written (official's staging buffer or
         stage-3 reduce bucket beyond a small model's gradients, `PeakPrediction.untouched`): never
         resident.
Phase 2: what glibc's heap keeps of the freed tensors at the peak (`PeakPrediction.heap_kept`, counted by
         `heap_kept`: a step's forward temporaries and, where the forward gathers, its released
         parameters).
Phase 3: what the process holds beside its tensors once its engine is built. That depends on the machine
         (its libraries, its kernels' buffers), so it is read off the run once the run has started (the
         `[model]` line's `rss_beside_tensors_mb`), and before launch (the preflight) taken per impl
         from the table bench/resident_base.py measures on a tiny run: `at_initialize_mb`.

On CUDA the unit is the caching allocator's reserved memory: the tensors' peak on the device and what the
allocator keeps cached beyond it (`PeakPrediction.cached`, counted by `cuda.cached`). The CUDA context
is outside it, and outside what the preflight is offered (free memory, asked once a context exists).
"""

from __future__ import annotations

import json
from functools import cache
from importlib import resources

MB = 2**20


@cache
def base_table() -> dict[str, float]:
    """{impl: MB a rank holds resident beside its tensors once its engine is built}, measured on a tiny
    run (resident_base.json's `at_initialize_mb`)."""
    text = resources.files("zero_lab.analysis.memory").joinpath("resident_base.json").read_text()
    return json.loads(text)["at_initialize_mb"]


def base_resident_bytes(impl: str) -> int:
    """What a rank of `impl` holds beside its tensors once its engine is built, before any run says; a
    script or an engine of your own takes nano's."""
    table = base_table()
    return int(table.get(impl, table["nano"]) * MB)


def resident_bytes(tensors: int, heap_kept: int, impl: str, beside_after_initialize: int | None = None) -> int:
    """Phases 2-3 on the tensors' resident peak, resident bytes on a CPU. beside_after_initialize: what the
    rank held beside its tensors once its engine was built (the run's own reading); without it, the table's."""
    return tensors + heap_kept + (base_resident_bytes(impl) if beside_after_initialize is None
                                  else beside_after_initialize)


def predicted_resident_bytes(prediction, impl: str, device: str, beside_after_initialize: int | None = None) -> int:
    """Phases 1-3 for a `PeakPrediction` of one rank, in the unit the machine limits: resident bytes on a
    CPU, reserved bytes on a GPU. A run's own reading (resident less allocated, once the engine is built)
    already lacks what was allocated by then and never written: it is added back."""
    if device == "cuda":
        return prediction.peak_seen_on(device) + prediction.cached
    if beside_after_initialize is not None:
        beside_after_initialize += prediction.untouched_at_initialize
    return resident_bytes(prediction.peak - prediction.untouched, prediction.heap_kept, impl, beside_after_initialize)
