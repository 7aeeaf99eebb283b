"""A CPU rank's resident memory at its peak, predicted: the live tensors `peak_memory` predicts, plus
what the process holds beside them - the interpreter, torch and its libraries, the engine, its
threads' and the allocator's own.

That second part depends on the machine (its libraries, its kernels' buffers, its allocator), so it is
read off the run where the run has started, and taken from a table only before launch:
- before launch (the preflight): the whole of it per impl, as bench/resident_base.py measured it on a
  tiny run (the rank's resident high-water mark less its tensors' peak): `beside_tensors_mb`;
- in a run's summary: what the rank held beside its tensors once the engine was built (the `[model]`
  line's `rss_beside_tensors_mb`, measured on this machine), plus what the steps add beside the
  tensors, from the same bench: `growth_in_steps_mb`.

On CUDA the device's memory holds tensors alone (and the CUDA context), so there is nothing to add.
A tensor allocated and never written is not resident: a run's summary leaves out the part of official's
staging buffer a small model's gradients never reach (`PeakPrediction.untouched`).
What the prediction leaves out: glibc's allocator keeps freed heap memory for reuse, and a run that
frees many medium tensors (stage 3's gathered units, a larger model's activations) holds more
resident than it has live. So the prediction is a floor on the host's bytes, closest on the tiny
model and on large tensors.
"""

from __future__ import annotations

import json
from functools import cache
from importlib import resources

MB = 2**20


@cache
def resident_table() -> dict[str, dict[str, float]]:
    """resident_base.json: {"beside_tensors_mb": {impl: MB}, "growth_in_steps_mb": {impl: MB}}."""
    return json.loads(resources.files("zero_lab.analysis.memory").joinpath("resident_base.json").read_text())


def base_table() -> dict[str, float]:
    """{impl: MB a rank holds resident beside its tensors at its peak}, measured on a tiny run."""
    return resident_table()["beside_tensors_mb"]


def _per_impl(column: str, impl: str) -> int:
    """One impl's MB of a column in bytes; a script or an engine of your own takes nano's."""
    table = resident_table()[column]
    return int(table.get(impl, table["nano"]) * MB)


def base_resident_bytes(impl: str) -> int:
    """What a rank of `impl` holds resident beside its tensors at its peak, before any run says."""
    return _per_impl("beside_tensors_mb", impl)


def predicted_resident_bytes(predicted_peak: int, impl: str, device: str,
                             beside_after_initialize: int | None = None) -> int:
    """The predicted peak of one rank in the unit its machine limits: resident bytes on a CPU, the
    tensors' bytes on a GPU. beside_after_initialize: what the rank held beside its tensors once its
    engine was built (the run's own reading); without it, the table's whole figure."""
    if device == "cuda":
        return predicted_peak
    if beside_after_initialize is None:
        return predicted_peak + base_resident_bytes(impl)
    return predicted_peak + beside_after_initialize + _per_impl("growth_in_steps_mb", impl)
