"""DeepSpeed's checkpoint files on disk: their names, a safe write, and a checked read.

Layout (official DeepSpeed's, so its tools read nano's checkpoints and nano reads its):
    <dir>/latest                                              the last complete tag, one line
    <dir>/<tag>/mp_rank_00_model_states.pt                    stages 0-2: rank 0's module and steps
    <dir>/<tag>/zero_pp_rank_<r>_mp_rank_00_model_states.pt   stage 3: one per rank
    <dir>/<tag>/[bf16_]zero_pp_rank_<r>_mp_rank_00_optim_states.pt   one per partition
A save:
    Phase 1: rank 0 clears a leftover `<dir>/.<tag>.partial` (an earlier save that died) and every
             rank writes its files into it, each to a temporary name renamed when complete.
    Phase 2: once every rank has written (a barrier), rank 0 renames the directory to `<dir>/<tag>`.
    Phase 3: rank 0 writes `latest` the same way, last. A crash before it leaves `latest` naming
             the previous, complete tag.
Every read uses torch.load(weights_only=True): nano writes only tensors, numbers, strings, lists
and dicts. Official DeepSpeed's optimizer files also pickle three of its classes (the ZeRO stage
enum, its loss scaler, a fragment address); they are read as the plain stand-ins below, so no
code from a file runs and DeepSpeed need not be installed.
"""

from __future__ import annotations

import os
import pickle
import shutil
import types
import zipfile
from typing import Any

import torch

from zero_lab.nano import stages
from zero_lab.nano.errors import CheckpointError

LATEST = "latest"
PARTIAL_SUFFIX = ".partial"


def model_states_name(layout: stages.CheckpointLayout, rank: int) -> str:
    """One file per rank where the checkpoint layout says so (official's stage 3), else rank 0's one."""
    if layout.model_states_per_rank:
        return f"zero_pp_rank_{rank}_mp_rank_00_model_states.pt"
    return "mp_rank_00_model_states.pt"


def optim_states_name(precision: str, rank: int) -> str:
    prefix = "bf16_" if precision == "bf16" else ""
    return f"{prefix}zero_pp_rank_{rank}_mp_rank_00_optim_states.pt"


def partial_directory(save_dir: str, tag: str) -> str:
    return os.path.join(save_dir, f".{tag}{PARTIAL_SUFFIX}")


def write_file(state: Any, path: str) -> int:
    """torch.save to a temporary name, flushed to disk, then renamed; returns the bytes written.
    Stand-ins in `state` are written under official DeepSpeed's class names."""
    temporary = f"{path}.tmp{os.getpid()}"
    with open(temporary, "wb") as handle:
        torch.save(state, handle, pickle_module=_OFFICIAL_NAMES)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, path)
    return os.path.getsize(path)


def write_latest(save_dir: str, tag: str) -> None:
    temporary = os.path.join(save_dir, f".{LATEST}.tmp{os.getpid()}")
    with open(temporary, "w") as handle:
        handle.write(tag)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, os.path.join(save_dir, LATEST))


def start_directory(save_dir: str, tag: str) -> str:
    """Phase 1 on rank 0: an empty partial directory for this tag."""
    partial = partial_directory(save_dir, tag)
    shutil.rmtree(partial, ignore_errors=True)
    os.makedirs(partial)
    return partial


def finish_directory(save_dir: str, tag: str) -> None:
    """Phase 2 on rank 0: the partial directory becomes the tag (an older one of that name goes)."""
    final = os.path.join(save_dir, tag)
    if os.path.exists(final):
        retired = f"{partial_directory(save_dir, tag)}.old"
        shutil.rmtree(retired, ignore_errors=True)
        os.replace(final, retired)
        os.replace(partial_directory(save_dir, tag), final)
        shutil.rmtree(retired, ignore_errors=True)
    else:
        os.replace(partial_directory(save_dir, tag), final)


def publish(save_dir: str, tag: str, rank: int, save_latest: bool, barrier) -> None:
    """Phase 2 on every rank, once each has written its files: after `barrier()` (every rank's files are
    in the partial directory) rank 0 makes it the tag and, when asked, points `latest` at it; the
    second `barrier()` holds every rank until the tag is published."""
    barrier()
    if rank == 0:
        finish_directory(save_dir, tag)
        if save_latest:
            write_latest(save_dir, tag)
    barrier()


def resolve_tag(load_dir: str, tag: str | None) -> str | None:
    """The tag to load: the one given, else the one `latest` names (None when there is none)."""
    if tag is not None:
        if not os.path.isdir(os.path.join(load_dir, str(tag))):
            raise CheckpointError(f"checkpoint tag {tag!r} does not exist in {load_dir}; pass a tag that does "
                                  f"({', '.join(list_tags(load_dir)) or 'none saved'})")
        return str(tag)
    latest = os.path.join(load_dir, LATEST)
    if not os.path.isfile(latest):
        return None
    with open(latest) as handle:
        named = handle.read().strip()
    if not os.path.isdir(os.path.join(load_dir, named)):
        raise CheckpointError(f"{latest} names tag {named!r}, which does not exist; pass an existing tag")
    return named


def list_tags(directory: str) -> list[str]:
    if not os.path.isdir(directory):
        return []
    return sorted(name for name in os.listdir(directory)
                  if not name.startswith(".") and os.path.isdir(os.path.join(directory, name)))


class OfficialLossScaler:
    """Stand-in for DeepSpeed's pickled static LossScaler: its attributes, nothing else. nano also
    writes the scaler as one (see `_OfficialNamesPickler`): official's load takes the object as it
    is and calls its methods, so a plain dict there breaks official's first backward."""


class OfficialDynamicLossScaler(OfficialLossScaler):
    """Stand-in for DeepSpeed's pickled DynamicLossScaler."""


class OfficialFragmentAddress:
    """Stand-in for DeepSpeed's fragment_address (unused by nano)."""


def official_zero_stage(value: int) -> int:
    """DeepSpeed pickles its ZeroStageEnum as a call with the stage number: read it as that int."""
    return int(value)


STAND_INS = [(official_zero_stage, "deepspeed.runtime.zero.config.ZeroStageEnum"),
             (OfficialLossScaler, "deepspeed.runtime.fp16.loss_scaler.LossScaler"),
             (OfficialDynamicLossScaler, "deepspeed.runtime.fp16.loss_scaler.DynamicLossScaler"),
             (OfficialFragmentAddress, "deepspeed.utils.tensor_fragment.fragment_address")]
OFFICIAL_NAME_OF = {OfficialLossScaler: "deepspeed.runtime.fp16.loss_scaler.LossScaler",
                    OfficialDynamicLossScaler: "deepspeed.runtime.fp16.loss_scaler.DynamicLossScaler"}


class _OfficialNamesPickler(pickle._Pickler):
    """Python's own pickler, but a stand-in class is written under DeepSpeed's name, so official
    unpickles its own class (and nano reads it back as the stand-in). The C pickler cannot do this:
    it checks that the name imports to the very class, and DeepSpeed need not be installed."""

    def save_global(self, obj, name=None):
        official = OFFICIAL_NAME_OF.get(obj)
        if official is None:
            return super().save_global(obj, name)
        module, qualified = official.rsplit(".", 1)
        if self.proto >= 4:
            self.save(module)
            self.save(qualified)
            self.write(pickle.STACK_GLOBAL)
        else:
            self.write(pickle.GLOBAL + f"{module}\n{qualified}\n".encode())
        self.memoize(obj)


_OFFICIAL_NAMES = types.SimpleNamespace(__name__="official_names", Pickler=_OfficialNamesPickler)  # torch.save's


def damaged_record(path: str) -> str | None:
    """The first record of a torch zip file whose bytes do not match the CRC-32 the save wrote beside
    them, or None. torch.load does not check: a damaged tensor would load as other numbers. A file
    that is no zip archive (truncated, or another format) is left to torch.load to refuse."""
    try:
        with zipfile.ZipFile(path) as archive:
            return archive.testzip()
    except (zipfile.BadZipFile, OSError, EOFError, ValueError):
        return None


def read_file(path: str, mmap: bool = True) -> dict:
    """One checkpoint file, or a one-line CheckpointError naming the problem and the fix. `mmap`
    False: the tensors are read into memory, not mapped (a map of the whole file stays open)."""
    if not os.path.isfile(path):
        raise CheckpointError(f"checkpoint file {path} is missing; the save that wrote it did not finish "
                              f"or the file was removed; load another tag")
    damaged = damaged_record(path)
    if damaged is not None:
        raise CheckpointError(f"checkpoint file {path} is corrupt: its record {damaged} fails its CRC-32 check (its "
                              f"bytes changed after the save); load another tag or save again")
    try:
        with torch.serialization.safe_globals(STAND_INS):
            state = torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except (RuntimeError, EOFError, pickle.UnpicklingError, zipfile.BadZipFile, ValueError) as error:
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise CheckpointError(f"checkpoint file {path} is truncated or corrupt ({reason[:160]}); "
                              f"load another tag or save again") from None
    if not isinstance(state, dict):
        raise CheckpointError(f"checkpoint file {path} holds a {type(state).__name__}, not a DeepSpeed "
                              f"checkpoint dict; point at a directory DeepSpeed or nano saved")
    return state


def optimizer_paths(load_dir: str, tag: str, parameters_only: bool = False) -> list[str]:
    """A tag's optimizer files, by rank. `parameters_only`: none is no error (the module alone loads)."""
    directory = os.path.join(load_dir, tag)
    paths = [os.path.join(directory, name) for name in sorted(os.listdir(directory))
             if name.endswith("_optim_states.pt") and "zero_pp_rank_" in name]
    if not paths and not parameters_only:
        raise CheckpointError(f"{directory} has no *_optim_states.pt files (official stage 0 keeps its optimizer "
                              f"elsewhere, which nano cannot convert); load a ZeRO stage 1-3 checkpoint")
    return sorted(paths, key=lambda path: int(os.path.basename(path).split("zero_pp_rank_")[1].split("_")[0]))


def read_model_states(load_dir: str, tag: str) -> tuple[str, dict]:
    """(path, contents) of the tag's model states: rank 0's per-rank file, else the one file."""
    directory = os.path.join(load_dir, tag)
    per_rank = os.path.join(directory, model_states_name(stages.PER_PARAMETER_FILES, 0))
    model_path = per_rank if os.path.exists(per_rank) else os.path.join(directory,
                                                                         model_states_name(stages.FLAT_FILES, 0))
    model_states = read_file(model_path)
    for key in ("param_shapes", "module"):
        if key not in model_states:
            raise CheckpointError(f"{model_path} has no {key!r}; it is not a DeepSpeed model-states file")
    return model_path, model_states


def read_tag(load_dir: str, tag: str) -> tuple[str, dict, list[dict], list[str]]:
    """A tag's files, read: (model-states path, model states, every optimizer file, their paths)."""
    paths = optimizer_paths(load_dir, tag)
    model_path, model_states = read_model_states(load_dir, tag)
    return model_path, model_states, [read_file(path) for path in paths], paths
