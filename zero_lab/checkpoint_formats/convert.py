"""`zero-lab checkpoint convert SRC --to FORMAT OUT` and `checkpoint inspect`, for all four formats.

A conversion:
    Phase 1 (`open_source`): SRC's format is detected from its files and it is opened for reading;
             a missing, truncated or mismatched file is a CheckpointError here, before OUT exists.
    Phase 2 (`predicted_peak_bytes`): the most memory the conversion will hold at once beyond what
             is mapped from files, from the shapes alone; the CLI prints it before starting.
    Phase 3: the target writes into `.<OUT's name>.partial` beside OUT, one parameter at a time;
             only when every file is written is it renamed to OUT. A failure removes the partial
             directory, so OUT is either complete or absent.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from typing import Callable

from zero_lab.checkpoint_formats import dcp, deepspeed_target, hf, universal
from zero_lab.checkpoint_formats.common import (FLOAT_BYTES, FORMATS, KEYS, MASTER, MOMENTS, Source,
                                                bytes_of_values_or_zeros)
from zero_lab.checkpoint_formats.deepspeed_source import DeepSpeedSource, is_deepspeed_directory
from zero_lab.fsdp2.checkpoint import is_dcp_directory
from zero_lab.nano.checkpoint import files
from zero_lab.nano.errors import CheckpointError

STEP_BYTES = 4  # Adam's step, one fp32 number, which the universal and DCP targets make per parameter


def detect(directory: str, tag: str | None = None) -> tuple[str, str, str]:
    """(format, directory holding the tags, tag) of SRC; SRC may be a checkpoint directory or one tag in it."""
    if not os.path.isdir(directory):
        raise CheckpointError(f"checkpoint directory {directory} does not exist; pass the directory a save or a "
                              f"conversion wrote")
    if hf.is_hf_directory(directory):
        return "hf", directory, hf.HF_TAG
    if os.path.isfile(os.path.join(directory, universal.LATEST)) or tag is not None and \
            universal.is_universal_directory(os.path.join(directory, tag)):
        return "universal", directory, universal.resolve_tag(directory, tag)
    parent, name = os.path.split(os.path.normpath(directory))
    for check, format in ((universal.is_universal_directory, "universal"), (is_dcp_directory, "dcp"),
                          (is_deepspeed_directory, "deepspeed")):
        if tag is None and check(directory):  # SRC is one tag's directory
            return format, parent, name
    resolved = files.resolve_tag(directory, tag)
    if resolved is None:
        raise CheckpointError(f"{directory} holds no checkpoint of any format zero-lab reads (no `latest`, "
                              f"`latest_universal` or {hf.WEIGHTS}); pass a directory a save or a conversion wrote")
    tag_directory = os.path.join(directory, resolved)
    for check, format in ((universal.is_universal_directory, "universal"), (is_dcp_directory, "dcp"),
                          (is_deepspeed_directory, "deepspeed")):
        if check(tag_directory):
            return format, directory, resolved
    raise CheckpointError(f"{tag_directory} holds no DeepSpeed, universal or DCP files; pass a tag a save wrote")


def open_source(directory: str, tag: str | None = None) -> Source:
    format, root, resolved = detect(directory, tag)
    if format == "hf":
        return hf.HfSource(root)
    if format == "universal":
        return universal.UniversalSource(root, resolved)
    if format == "dcp":
        return dcp.DcpSource(root, resolved)
    return DeepSpeedSource(root, resolved)


def predicted_peak_bytes(source: Source, to: str) -> int:
    """Bytes the conversion holds at once beyond mapped files: one read of one key of one parameter
    for the DeepSpeed and universal targets (the rank files are assembled in mapped scratch files),
    of one parameter's weights for hf; for DCP, one read while the entry before it is still held,
    as DCP's writer keeps the last tensor it wrote until the next one is made."""
    facts = source.facts
    if to == "hf":
        return max((source.read_bytes(name, MASTER) for name in facts.shapes), default=0)
    if to in ("deepspeed", "universal"):
        largest = max((bytes_of_values_or_zeros(source, name, key) for name in facts.shapes for key in KEYS),
                      default=0)
        return max(largest, STEP_BYTES) if to == "universal" else largest
    # dcp: (held after the read, peak during it) of each entry, in the order DCP writes them (the
    # state dict's): the masters, the buffers (held already), then each parameter's step and moments
    entries = [(facts.shapes[name].numel() * FLOAT_BYTES, bytes_of_values_or_zeros(source, name, MASTER))
               for name in facts.shapes]
    entries += [(0, 0)] * len(facts.buffers)
    for name in facts.shapes:
        entries += [(STEP_BYTES, STEP_BYTES)] + [(facts.shapes[name].numel() * FLOAT_BYTES,
                                                  bytes_of_values_or_zeros(source, name, key)) for key in MOMENTS]
    pairs = [held + peak for (held, _), (_, peak) in zip(entries, entries[1:])]
    return max(pairs + [peak for _, peak in entries[:1]], default=0)


def not_held(source: Source, to: str) -> list[str]:
    """One line for each part of the training state the target format cannot hold, or the source lacks."""
    facts, lines = source.facts, list(source.facts.left_behind)
    if facts.format == "hf" and to != "hf":
        lines.append("the source holds weights only: Adam's moments start at zero (step 0) and the schedule and "
                     "step counters at their start")
    if to == "hf":
        lines.append("hf holds the weights only: Adam's moments and step, the schedule, the step counters and the "
                     "loss scaler are not written")
    if to == "dcp" and (facts.loss_scaler.get("dynamic") or float(facts.loss_scaler.get("cur_scale", 1.0)) != 1.0):
        lines.append("dcp holds no loss scaler (FSDP2 runs without fp16 loss scaling): its state is not written")
    return lines


@dataclass
class Options:
    stage: int | None = None  # --to deepspeed: the ZeRO stage (default: the source's, else 2)
    world_size: int | None = None  # --to deepspeed: the ranks to cut for (default: the source's, else 1)
    write_config: Callable[[str], object] | None = None  # --to hf: writes config.json into a directory


def convert(source: Source, to: str, out: str, options: Options) -> list[str]:
    """Phase 3: OUT, complete, or nothing. Returns the files written (under OUT)."""
    if to not in FORMATS:
        raise CheckpointError(f"--to {to} is not a format; pass one of {', '.join(FORMATS)}")
    if os.path.exists(out):
        raise CheckpointError(f"{out} exists; choose a new OUT directory (nothing was written)")
    parent, name = os.path.split(os.path.abspath(out))
    partial = os.path.join(parent, f".{name}.partial")
    shutil.rmtree(partial, ignore_errors=True)
    os.makedirs(partial)
    try:
        if to == "deepspeed":
            facts = source.facts
            stage = options.stage if options.stage is not None else facts.stage if facts.stage is not None else 2
            world_size = options.world_size or facts.world_size or 1
            written = deepspeed_target.write(source, partial, stage, world_size)
        elif to == "universal":
            written = universal.write(source, partial)
        elif to == "dcp":
            written = dcp.write(source, partial)
        else:
            written = hf.write(source, partial, options.write_config)
        os.replace(partial, out)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    return [os.path.join(out, os.path.relpath(path, partial)) for path in written]


def describe(directory: str, tag: str | None = None) -> dict:
    """`checkpoint inspect` of any format: DeepSpeed's own description, else the facts all formats share."""
    format, root, resolved = detect(directory, tag)
    if format == "deepspeed":
        from zero_lab.nano.checkpoint.offline import OpenCheckpoint
        from zero_lab.nano.checkpoint.offline import describe as describe_deepspeed

        return {"format": format, **describe_deepspeed(OpenCheckpoint.open(root, resolved))}
    source = open_source(directory, tag)
    facts = source.facts
    holder = root if format == "hf" else os.path.join(root, resolved)
    sizes = {os.path.relpath(os.path.join(folder, file), holder): os.path.getsize(os.path.join(folder, file))
             for folder, _, names in os.walk(holder) for file in names}
    return {"format": format, "directory": root, "tag": None if format == "hf" else resolved,
            "world_size": facts.world_size, "global_steps": facts.global_steps,
            "global_samples": facts.global_samples, "skipped_steps": facts.skipped_steps,
            "adam_step": facts.step, "parameters": facts.numel(), "tensors": len(facts.shapes),
            "groups": len(facts.groups), "lr_scheduler": facts.lr_scheduler,
            "bytes": sum(sizes.values()), "files": len(sizes),
            "config": facts.ds_config}
