"""FSDP2's distributed checkpoint (DCP), read and written on one process, one tensor at a time.

The keys are the ones `zero_lab/fsdp2/checkpoint.py` saves (model.<name>, optimizer.state.<name>.<key>,
optimizer.param_groups.<g>.<field>, train_state.<counter>), so `run --impl fsdp2 --resume` loads
what `convert --to dcp` writes, at any world size: DCP reshards on load.
Reading:
    Phase 1: `.metadata` names every entry, its global shape and the file and offset of each chunk;
             every file it names must be there and long enough. The small entries (groups,
             counters, schedule) are read whole.
    Phase 2: `read` loads one entry into one new tensor (dcp.load of that key alone).
Writing:
    Phase 1: the state dict is built with tensors on the meta device (shapes only) for DCP's planner.
    Phase 2: DCP's writer asks the planner for each tensor as it writes it (`_StreamingPlanner`),
             and the source makes it then; each entry goes to its own `.distcp` file.
"""

from __future__ import annotations

import os
import warnings

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner, DefaultSavePlanner
from torch.distributed.checkpoint.metadata import BytesStorageMetadata, TensorStorageMetadata
from torch.distributed.checkpoint.planner import WriteItemType

from zero_lab.checkpoint_formats.common import FLOAT_BYTES, MASTER, MOMENTS, Facts, Source, values_or_zeros
from zero_lab.fsdp2.checkpoint import METADATA, MODEL, OPTIMIZER, TRAIN_STATE
from zero_lab.nano.checkpoint import files
from zero_lab.nano.errors import CheckpointError

HYPER = ("lr", "betas", "eps", "weight_decay")  # what moves between engines; the rest is torch's own
STATE = f"{OPTIMIZER}.state"


class _SmallEntriesPlanner(DefaultLoadPlanner):
    """DCP's load planner, but each non-tensor entry is kept here, read with weights_only=True."""

    def __init__(self):
        super().__init__(flatten_state_dict=False)
        self.loaded: dict = {}

    def load_bytes(self, read_item, value) -> None:
        self.loaded[read_item.dest_index.fqn] = torch.load(value, weights_only=True)


def _one_process(call, *args, **kwargs):
    """A DCP call on this process alone (DCP warns that it assumes so; here that is the point)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        return call(*args, **kwargs, no_dist=True)


def _read_entries(path: str, keys: list[str]) -> dict:
    planner = _SmallEntriesPlanner()
    _one_process(dcp.load, {key: None for key in keys}, checkpoint_id=path, planner=planner)
    return planner.loaded


def _nest(flat: dict, paths: dict) -> dict:
    """Entries under their DCP object paths put back into nested dicts and lists."""
    nested: dict = {}
    for key, value in flat.items():
        node, path = nested, paths.get(key, (key,))
        for part in path[:-1]:
            node = node.setdefault(part, {})
        node[path[-1]] = value
    return nested


class DcpSource:
    def __init__(self, directory: str, tag: str):
        # Phase 1
        self.path = os.path.join(directory, tag)
        try:
            metadata = FileSystemReader(self.path).read_metadata()
        except Exception as error:  # a damaged pickle raises whatever its bytes happen to decode to
            raise CheckpointError(f"{os.path.join(self.path, METADATA)} is truncated or corrupt "
                                  f"({type(error).__name__}); convert or save the checkpoint again") from None
        self._check_files(metadata)
        entries = metadata.state_dict_metadata
        self.tensors = {key: entry for key, entry in entries.items() if isinstance(entry, TensorStorageMetadata)}
        small = _nest(_read_entries(self.path, [key for key, entry in entries.items()
                                                if isinstance(entry, BytesStorageMetadata)]),
                      metadata.planner_data or {})
        groups = small.get(OPTIMIZER, {}).get("param_groups", {})
        groups = [groups[index] for index in sorted(groups)] if isinstance(groups, dict) else list(groups)
        shapes = {}
        for group in groups:
            for name in group["params"]:
                entry = self.tensors.get(f"{MODEL}.{name}")
                if entry is None:
                    raise CheckpointError(f"{self.path} names parameter {name} in a group but holds no {MODEL}.{name}; "
                                          f"the checkpoint is incomplete, save or convert it again")
                shapes[name] = entry.size
                for key in MOMENTS:
                    moment = self.tensors.get(f"{STATE}.{name}.{key}")
                    if moment is not None and moment.size != entry.size:
                        raise CheckpointError(f"{self.path}: {STATE}.{name}.{key} has shape {tuple(moment.size)}, "
                                              f"the parameter {tuple(entry.size)} (mismatched shapes); convert again")
        first = next(iter(shapes), None)
        step_key = f"{STATE}.{first}.step"
        step = int(float(self._load(step_key))) if first and step_key in self.tensors else 0
        train = small.get(TRAIN_STATE, {})
        buffers = {key[len(MODEL) + 1:]: self._load(key) for key in self.tensors
                   if key.startswith(f"{MODEL}.") and key[len(MODEL) + 1:] not in shapes}
        # The ranks that saved it: DCP names each file `__<rank>_<index>.distcp`.
        ranks = {info.relative_path.split("_")[2] for info in metadata.storage_data.values()}
        self.facts = Facts("dcp", tag, shapes,
                           [{**{key: group[key] for key in HYPER if key in group}, "names": list(group["params"])}
                            for group in groups], step, train.get("global_steps"), train.get("global_samples"),
                           train.get("skipped_steps"), train.get("lr_scheduler"), {}, None, torch.float32, buffers,
                           {}, None, len(ranks))
        self.chunks = {key: sorted((chunk.sizes.numel() for chunk in entry.chunks), reverse=True)
                       for key, entry in self.tensors.items()}

    def _check_files(self, metadata) -> None:
        """A missing rank's shard or a file cut short is one line, before anything is read."""
        needed: dict[str, int] = {}
        for info in metadata.storage_data.values():
            needed[info.relative_path] = max(needed.get(info.relative_path, 0), info.offset + info.length)
        for relative_path, length in sorted(needed.items()):
            path = os.path.join(self.path, relative_path)
            if not os.path.isfile(path):
                raise CheckpointError(f"{path} is missing (a rank's shard of this DCP checkpoint); copy every "
                                      f"__<rank>_0.distcp file beside {METADATA}, or convert another tag")
            if os.path.getsize(path) < length:
                raise CheckpointError(f"{path} is truncated ({os.path.getsize(path)} bytes, the index needs {length}); "
                                      f"save or convert the checkpoint again")

    def _load(self, key: str) -> torch.Tensor:
        entry = self.tensors[key]
        values = {key: torch.empty(entry.size, dtype=entry.properties.dtype)}
        _one_process(dcp.load, values, checkpoint_id=self.path, planner=DefaultLoadPlanner(flatten_state_dict=False))
        return values[key]

    # Phase 2
    def _key(self, name: str, key: str) -> str:
        return f"{MODEL}.{name}" if key == MASTER else f"{STATE}.{name}.{key}"

    def read(self, name: str, key: str) -> torch.Tensor | None:
        if key != MASTER and not self.facts.has_moments:
            return None
        return self._load(self._key(name, key)).float()

    def read_bytes(self, name: str, key: str) -> int:
        """The entry, and DCP's reader holding up to two of its stored chunks at once while it copies."""
        if key != MASTER and not self.facts.has_moments:
            return 0
        return (self.facts.shapes[name].numel() + sum(self.chunks[self._key(name, key)][:2])) * FLOAT_BYTES


class _StreamingPlanner(DefaultSavePlanner):
    """DCP's default planner, but each tensor is made when the writer reaches it."""

    def __init__(self, makers: dict):
        super().__init__()
        self.makers = makers

    def resolve_data(self, write_item):
        if write_item.type == WriteItemType.BYTE_IO:
            return super().resolve_data(write_item)
        return self.makers[write_item.index.fqn]()


def _torch_group(hyper: dict) -> dict:
    """A group with every field torch's AdamW has (FSDP2's load expects each), the source's values set."""
    defaults = dict(torch.optim.AdamW([torch.zeros(1)]).param_groups[0])
    defaults.pop("params")
    return {**defaults, **{key: hyper[key] for key in HYPER if key in hyper}}


def write(source: Source, out: str) -> list[str]:
    """Write `out/<tag>/` (DCP) and `out/latest`; `out` is the conversion's partial directory."""
    facts = source.facts
    # Phase 1
    meta = {name: torch.empty(shape, device="meta") for name, shape in facts.shapes.items()}
    model = {**meta, **{alias: meta[name] for alias, name in facts.shared_params.items() if name in meta},
             **{name: torch.empty(values.shape, dtype=values.dtype, device="meta")
                for name, values in facts.buffers.items()}}
    state = {name: {"step": torch.empty((), device="meta"), **{key: meta[name] for key in MOMENTS}}
             for name in facts.shapes}
    groups = [{**_torch_group(group), "params": list(group["names"])} for group in facts.groups]
    train = {"global_steps": int(facts.global_steps or 0), "global_samples": int(facts.global_samples or 0),
             "skipped_steps": int(facts.skipped_steps or 0),
             "lr_scheduler": dict(facts.lr_scheduler or {"last_batch_iteration": int(facts.global_steps or 0) - 1})}
    makers = {f"{MODEL}.{name}": (lambda name=name: values_or_zeros(source, name, MASTER)) for name in facts.shapes}
    makers.update({f"{MODEL}.{alias}": (lambda name=name: values_or_zeros(source, name, MASTER))
                   for alias, name in facts.shared_params.items() if name in facts.shapes})
    makers.update({f"{MODEL}.{name}": (lambda values=values: values) for name, values in facts.buffers.items()})
    for name in facts.shapes:
        makers[f"{STATE}.{name}.step"] = lambda: torch.tensor(float(facts.step))
        for key in MOMENTS:
            makers[f"{STATE}.{name}.{key}"] = lambda name=name, key=key: values_or_zeros(source, name, key)
    directory = os.path.join(out, facts.tag)
    # Phase 2
    # One file per entry: DCP's writer keeps every tensor of a file until the file is complete, so
    # FSDP2's one file per rank would hold the whole model here (DCP's reader takes either).
    _one_process(dcp.save, {MODEL: model, OPTIMIZER: {"state": state, "param_groups": groups}, TRAIN_STATE: train},
                 storage_writer=FileSystemWriter(directory, single_file_per_rank=False),
                 planner=_StreamingPlanner(makers))
    files.write_latest(out, facts.tag)
    return [os.path.join(directory, name) for name in sorted(os.listdir(directory))]

