"""What every format shares: the facts of a training state, the keys of a parameter's values,
copying a range out of stored pieces, and memory-mapped scratch tensors."""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field
from typing import Protocol

import numpy
import torch

from zero_lab.nano.checkpoint.contents import FORMAT_VERSION, model_shapes
from zero_lab.nano.errors import CheckpointError

MASTER = "master"
MOMENTS = ("exp_avg", "exp_avg_sq")
KEYS = (MASTER, *MOMENTS)
FORMATS = ("deepspeed", "universal", "dcp", "hf")
FLOAT_BYTES = 4  # every value a conversion moves is fp32


@dataclass
class Facts:
    """A training state less its parameters' values."""

    format: str
    tag: str
    shapes: dict[str, torch.Size]  # every trainable parameter, in the order its groups hold them
    groups: list[dict]  # per parameter group: {"names": [...], and its hyper-parameters (lr, betas, ...)}
    step: int = 0  # Adam's step; 0: the source holds no moments
    global_steps: int | None = None
    global_samples: int | None = None
    skipped_steps: int | None = None
    lr_scheduler: dict | None = None
    loss_scaler: dict = field(default_factory=dict)  # official's scaler fields (cur_scale, dynamic, ...)
    ds_config: dict | None = None
    model_dtype: torch.dtype = torch.float32  # the module's dtype (a DeepSpeed `module` holds it)
    buffers: dict[str, torch.Tensor] = field(default_factory=dict)  # persistent buffers, whole
    shared_params: dict[str, str] = field(default_factory=dict)  # tied alias -> name
    stage: int | None = None  # the ZeRO stage it was saved at, where the format says
    world_size: int | None = None  # the ranks that saved it, where the format says
    left_behind: list[str] = field(default_factory=list)  # what the source holds that no conversion carries

    @property
    def has_moments(self) -> bool:
        return self.step > 0

    def numel(self) -> int:
        return sum(shape.numel() for shape in self.shapes.values())

    def largest_numel(self) -> int:
        return max((shape.numel() for shape in self.shapes.values()), default=0)


class Source(Protocol):
    facts: Facts

    def read(self, name: str, key: str) -> torch.Tensor | None:
        """Parameter `name`'s whole values of `key`, fp32, shaped; None for a moment it lacks."""

    def read_bytes(self, name: str, key: str) -> int:
        """The bytes `read(name, key)` allocates (what the peak prediction adds up)."""


def values_or_zeros(source: Source, name: str, key: str) -> torch.Tensor:
    """A moment the source lacks is zeros, as Adam's state before its first step."""
    values = source.read(name, key)
    return values if values is not None else torch.zeros(source.facts.shapes[name])


def bytes_of_values_or_zeros(source: Source, name: str, key: str) -> int:
    """What `values_or_zeros` allocates (a source lacks the moments exactly when its step is 0)."""
    if key == MASTER or source.facts.has_moments:
        return source.read_bytes(name, key)
    return source.facts.shapes[name].numel() * FLOAT_BYTES


def copy_range(pieces: list[torch.Tensor], start: int, out: torch.Tensor) -> None:
    """Elements [start, start + out.numel()) of `pieces` laid end to end, into flat `out`."""
    position, done = 0, 0
    for piece in pieces:
        if done == out.numel():
            return
        end = position + piece.numel()
        if end > start + done:
            within = start + done - position
            count = min(piece.numel() - within, out.numel() - done)
            out[done:done + count] = piece[within:within + count]
            done += count
        position = end
    if done < out.numel():
        raise CheckpointError(f"the stored partitions end {out.numel() - done} elements short of a parameter; "
                              f"the files do not belong together (a truncated or mismatched shard), "
                              f"convert another tag")


class Scratch:
    """Tensors backed by files in one directory, mapped into memory: a target fills them one
    parameter at a time and torch.save writes them out, so the pages live in the file system's
    cache and not in the process's own memory. `close` removes the directory."""

    def __init__(self, directory: str):
        self.directory = directory
        os.makedirs(directory, exist_ok=True)
        self.count = 0

    def zeros(self, numel: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        self.count += 1
        if numel == 0:
            return torch.zeros(0, dtype=dtype)
        width = torch.empty(0, dtype=dtype).element_size()
        mapped = numpy.memmap(os.path.join(self.directory, f"{self.count}.bin"), dtype=numpy.uint8, mode="w+",
                              shape=(numel * width,))
        return torch.from_numpy(mapped).view(dtype)

    def close(self) -> None:
        shutil.rmtree(self.directory, ignore_errors=True)


def precision_of(facts: Facts) -> str:
    """fp16, bf16 or fp32: the source's DeepSpeed config says, else the module's dtype."""
    config = facts.ds_config or {}
    for name, precision in (("fp16", "fp16"), ("bf16", "bf16"), ("bfloat16", "bf16")):
        if (config.get(name) or {}).get("enabled"):
            return precision
    return {torch.bfloat16: "bf16", torch.float16: "fp16"}.get(facts.model_dtype, "fp32")


def config_with_stage(facts: Facts, stage: int) -> dict:
    """The source's DeepSpeed config with the target's stage (a minimal one when the source has none)."""
    config = dict(facts.ds_config or {})
    config["zero_optimization"] = {**(config.get("zero_optimization") or {}), "stage": stage}
    if facts.ds_config is None and precision_of(facts) == "bf16":
        config["bf16"] = {"enabled": True}
    return config


def model_states(facts: Facts, module: dict, stored_names: list[list[str]], world_size: int, stage: int) -> dict:
    """A DeepSpeed model-states file (docs/checkpoints.md "The files"): `module` holds the parameters
    (whole, or empty at stage 3) and the buffers are added; `stored_names` are the parameters of
    each tensor the optimizer files store, in order."""
    return {"module": {**module, **facts.buffers}, "buffer_names": list(facts.buffers),
            "param_shapes": model_shapes(stored_names, facts.shapes), "shared_params": dict(facts.shared_params),
            "frozen_param_shapes": {}, "frozen_param_fragments": {}, "lr_scheduler": facts.lr_scheduler,
            "global_steps": facts.global_steps or 0, "global_samples": facts.global_samples or 0,
            "skipped_steps": facts.skipped_steps or 0, "dp_world_size": world_size, "mp_world_size": 1,
            "ds_config": config_with_stage(facts, stage), "ds_version": FORMAT_VERSION}
