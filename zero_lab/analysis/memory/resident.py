"""A CPU rank's resident memory at its peak, predicted: the live tensors `peak_memory` predicts, plus
what the process holds beside them - the interpreter, torch and its libraries, the engine, its
threads' and the allocator's own - measured per impl on this kind of machine by bench/resident_base.py
(a tiny run's resident high-water mark less its tensors' peak) and kept in resident_base.json.

On CUDA the device's memory holds tensors alone (and the CUDA context), so there is nothing to add.
What the prediction leaves out: glibc's allocator keeps freed heap memory for reuse, and a run that
frees many medium tensors (stage 3's gathered units, a larger model's activations) holds more
resident than it has live; a buffer allocated and never written (official's staging buffer on a
small model) is not resident at all. So the prediction is a floor on the host's bytes, closest on
the tiny model and on large tensors.
"""

from __future__ import annotations

import json
from functools import cache
from importlib import resources

MB = 2**20


@cache
def base_table() -> dict[str, float]:
    """{impl: MB resident beside the tensors} (resident_base.json)."""
    return json.loads(resources.files("zero_lab.analysis.memory").joinpath("resident_base.json").read_text())


def base_resident_bytes(impl: str) -> int:
    """What a rank of `impl` holds resident beside its tensors; nano's for a script or an engine of your own."""
    table = base_table()
    return int(table.get(impl, table["nano"]) * MB)


def predicted_resident_bytes(predicted_peak: int, impl: str, device: str) -> int:
    """The predicted peak of one rank in the unit its machine limits: resident bytes on a CPU, the
    tensors' bytes on a GPU."""
    return predicted_peak + (base_resident_bytes(impl) if device != "cuda" else 0)
