"""Hugging Face weights: one `model.safetensors` with the model's own names, for `from_pretrained`.

safetensors is an 8-byte little-endian header length, a JSON header naming each tensor's dtype,
shape and byte range, then the bytes end to end. The header needs only the shapes, so `write` puts
it down first and then appends each parameter's fp32 values as the source makes them: one
parameter in memory at a time. Tied aliases are stored once, as Hugging Face stores them.
The format holds weights only: no optimizer state, schedule or counters.
"""

from __future__ import annotations

import json
import os
import struct
from typing import Callable

import torch

from zero_lab.checkpoint_formats.common import FLOAT_BYTES, MASTER, Facts, Source
from zero_lab.nano.errors import CheckpointError

WEIGHTS = "model.safetensors"
HF_TAG = "global_step0"  # the tag a conversion from weights alone writes: no step has run on them
SAFETENSORS_DTYPE = {torch.float32: "F32", torch.bfloat16: "BF16", torch.float16: "F16", torch.int64: "I64"}
DTYPE_OF_SAFETENSORS = {name: dtype for dtype, name in SAFETENSORS_DTYPE.items() if dtype.is_floating_point}


def is_hf_directory(directory: str) -> bool:
    return os.path.isfile(os.path.join(directory, WEIGHTS))


class HfSource:
    """Reads the header, then each tensor's byte range into one new tensor (no whole-file map)."""

    def __init__(self, directory: str):
        self.path = os.path.join(directory, WEIGHTS)
        size = os.path.getsize(self.path)
        try:
            with open(self.path, "rb") as handle:
                (length,) = struct.unpack("<Q", handle.read(8))
                entries = json.loads(handle.read(length)) if 8 + length <= size else None
        except (struct.error, ValueError, UnicodeDecodeError):
            entries = None
        if not isinstance(entries, dict):
            raise CheckpointError(f"{self.path} is truncated or corrupt (no readable safetensors header); "
                                  f"write the weights again")
        entries.pop("__metadata__", None)
        self.start = 8 + length
        self.entries = {name: entry for name, entry in entries.items() if entry["dtype"] in DTYPE_OF_SAFETENSORS}
        end = max((entry["data_offsets"][1] for entry in self.entries.values()), default=0)
        if self.start + end > size:
            raise CheckpointError(f"{self.path} is truncated ({size} bytes, its header needs {self.start + end}); "
                                  f"write the weights again")
        shapes = {name: torch.Size(entry["shape"]) for name, entry in self.entries.items()}
        self.facts = Facts("hf", HF_TAG, shapes, [{"names": list(shapes)}])

    def read(self, name: str, key: str) -> torch.Tensor | None:
        if key != MASTER:
            return None
        entry = self.entries[name]
        values = torch.empty(self.facts.shapes[name], dtype=DTYPE_OF_SAFETENSORS[entry["dtype"]])
        with open(self.path, "rb") as handle:
            handle.seek(self.start + entry["data_offsets"][0])
            handle.readinto(values.reshape(-1).view(torch.uint8).numpy())
        return values.float()

    def read_bytes(self, name: str, key: str) -> int:
        if key != MASTER:
            return 0
        dtype = DTYPE_OF_SAFETENSORS[self.entries[name]["dtype"]]
        numel = self.facts.shapes[name].numel()
        stored = numel * torch.empty(0, dtype=dtype).element_size()
        return stored if dtype == torch.float32 else stored + numel * FLOAT_BYTES


def header(facts: Facts, names: list[str]) -> bytes:
    """The safetensors header for fp32 `names` (and the buffers), padded to 8 bytes as safetensors pads it."""
    entries, offset = {}, 0
    for name in names:
        shape, dtype = _shape_and_dtype(facts, name)
        size = shape.numel() * torch.empty(0, dtype=dtype).element_size()
        entries[name] = {"dtype": SAFETENSORS_DTYPE[dtype], "shape": list(shape), "data_offsets": [offset, offset + size]}
        offset += size
    text = json.dumps({"__metadata__": {"format": "pt"}, **entries}, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text


def _shape_and_dtype(facts: Facts, name: str) -> tuple[torch.Size, torch.dtype]:
    if name in facts.shapes:
        return facts.shapes[name], torch.float32
    return facts.buffers[name].shape, facts.buffers[name].dtype


def write(source: Source, out: str, write_config: Callable[[str], object] | None = None) -> list[str]:
    """Write `out/model.safetensors` (and config.json through `write_config`); `out` is the
    conversion's partial directory."""
    facts = source.facts
    names = [name for name in facts.shapes if name not in facts.shared_params] + \
        [name for name in facts.buffers if facts.buffers[name].dtype in SAFETENSORS_DTYPE]
    path = os.path.join(out, WEIGHTS)
    with open(path, "wb") as handle:
        handle.write(header(facts, names))
        for name in names:
            values = source.read(name, MASTER) if name in facts.shapes else facts.buffers[name]
            if values is None:
                raise CheckpointError(f"the source holds no values of {name}; convert another checkpoint")
            handle.write(values.contiguous().reshape(-1).view(torch.uint8).numpy().data)
            del values
        handle.flush()
        os.fsync(handle.fileno())
    written = [path]
    if write_config is not None:
        written.append(str(write_config(out)))
    return written
