"""Per-rank body: the operations stage 3 adds to a backward, counted against the model's own backward.

Every operation a rank's backward dispatches, counted by name (a `TorchDispatchMode`), once for
the plain model (`loss.backward()`, no engine) and once for nano's stage 3 on the same model and
batch; nano's own operations are the difference. The harness's preset `tiny` (Qwen3, two layers)
has sharded units of one parameter each and persistent norms that reduce in one spanning bucket.
The checks, per backward:
    - a sharded unit's gradient is its bucket: nano adds (`add_`) only the persistent pieces into
      their spanning bucket (one add per partition a piece crosses), none for the sharded units;
    - a gradient partition written whole is not zeroed first: nano zeroes (`zero_`) only the
      spanning buckets it fills piece by piece;
    - a spanning bucket's members' gradient partitions are views of one tensor, the share the
      reduce-scatter wrote, not copied into one partition each.
And per step, the global norm's operations: one dot per gradient partition, summed once
(`step_failures`), not a view, a slice and an add per partition.
A gradient that is only part of its storage (a view autograd cut from a `torch.cat`'s gradient) is
copied, not adopted: `shared_gradient_worker` checks the partitions of two units read through one cat.
"""

from __future__ import annotations

import collections
import copy
import json
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

import zero_lab.nano as nano
from zero_lab.workload.models import build_model, parameter_groups

REPO = Path(__file__).resolve().parents[2]


class OperationCount(TorchDispatchMode):
    """How many times each aten operation is dispatched while it is active."""

    def __init__(self):
        super().__init__()
        self.counts: collections.Counter = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.counts[func.overloadpacket.__name__] += 1
        return func(*args, **(kwargs or {}))


def backward_operations(loss: torch.Tensor, backward) -> collections.Counter:
    """The operations of `backward(loss)` (the forward that made `loss` not counted)."""
    with OperationCount() as counter:
        backward(loss)
    return counter.counts


def host_operations_worker(rank: int, world_size: int) -> list[str]:
    failures = []
    initial = build_model("tiny", seed=0)
    tokens = torch.randint(0, 256, (2, 32), generator=torch.Generator().manual_seed(rank))
    plain = copy.deepcopy(initial)
    plain(input_ids=tokens, labels=tokens).loss.backward()  # the first backward allocates what later ones reuse
    plain.zero_grad(set_to_none=True)
    reference = backward_operations(plain(input_ids=tokens, labels=tokens).loss, torch.Tensor.backward)
    config = json.loads((REPO / "harness" / "configs" / "zero3.json").read_text())
    model = copy.deepcopy(initial)
    engine, *_ = nano.initialize(model=model, model_parameters=parameter_groups(model, 0.1), config=config)
    optimizer = engine.optimizer
    sharded = {id(buffer) for entry in optimizer.gathering.entries for buffer in entry.buffers}
    persistent = [buffer for buffer in optimizer.buffers if id(buffer) not in sharded]
    spanning = [bucket for bucket in optimizer.gradient_collection.buckets if len(bucket.flat_ranges()) > 1]
    if not (persistent and spanning and len(sharded) > 2):
        failures.append(f"the model should have sharded units and a spanning bucket: {len(sharded)} sharded "
                        f"buffers, {len(persistent)} persistent, {len(spanning)} spanning buckets")
    slots = sum(len(slots) for pieces in optimizer.gradient_collection.pieces_of.values()
                for bucket, _, slots in pieces if any(bucket is other for other in spanning))
    for step in range(2):
        counts = backward_operations(engine(input_ids=tokens, labels=tokens).loss, engine.backward)
        for bucket in spanning:  # the share the reduce-scatter wrote is every member's partition
            storages = {optimizer.gradient_partitions[index].untyped_storage().data_ptr() for index in bucket.members}
            if len(storages) != 1:
                failures.append(f"world size {world_size} step {step}: a spanning bucket's {len(bucket.members)} "
                                f"members hold {len(storages)} gradient partitions, expected views of one share")
        with OperationCount() as stepped:
            engine.step()
        failures += step_failures(stepped.counts, optimizer, f"world size {world_size} step {step}")
        own = {name: counts[name] - reference[name] for name in ("add_", "zero_")}
        if own["add_"] != slots:
            failures.append(f"world size {world_size} step {step}: nano's backward adds {own['add_']} times, "
                            f"expected one add per persistent piece and partition it crosses ({slots}), "
                            "none for a sharded unit")
        if own["zero_"] != len(spanning):
            failures.append(f"world size {world_size} step {step}: nano's backward zeroes {own['zero_']} tensors, "
                            f"expected only its {len(spanning)} spanning bucket(s), no gradient partition")
    engine.destroy()
    return failures


def step_failures(counts: collections.Counter, optimizer, where: str) -> list[str]:
    """The norm's operations in a step: one dot per gradient partition (each under the 2^16 elements a
    CPU's BLAS sums exactly, so whole), summed once: no slice, view or add per partition (at most
    two of each in the whole step)."""
    failures = []
    if max(buffer.layout.partition_numel for buffer in optimizer.buffers) > 1 << 16:
        failures.append(f"{where}: a partition over 2^16 elements; the check expects one piece each")
    if counts["dot"] != len(optimizer.buffers):
        failures.append(f"{where}: the step's norm takes {counts['dot']} dots for {len(optimizer.buffers)} partitions")
    for name in ("slice", "add_", "view"):  # views: the norm's sum as one element, the persistent publish's rows
        if counts[name] > 2:
            failures.append(f"{where}: the step issues {counts[name]} {name} operations; the norm should issue "
                            "none per partition (the sum of the dots is one stack and one sum)")
    return failures


class Holder(torch.nn.Module):
    """A module that owns one parameter (its own unit at stage 3) and is never called."""

    def __init__(self, low: float, high: float):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.linspace(low, high, 64))


class Concatenated(torch.nn.Module):
    """Two units' parameters read through one `torch.cat`: autograd hands each a gradient that is a
    view of one shared tensor, so neither may become a bucket (freeing it would free the other's)."""

    def __init__(self):
        super().__init__()
        self.first, self.second = Holder(-1, 1), Holder(2, 3)

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        return (torch.cat([self.first.weight, self.second.weight]) * inputs).pow(2).sum()


def shared_gradient_worker(rank: int, world_size: int) -> list[str]:
    """Stage 3 (no persistent parameters) on `Concatenated`: each buffer's gradient partition after one
    backward equals the plain model's gradients, averaged over ranks, laid out as the buffer."""
    inputs = torch.linspace(0.5, 1.5, 128) * (rank + 1)
    plain = Concatenated()
    plain(inputs).backward()
    for parameter in plain.parameters():
        torch.distributed.all_reduce(parameter.grad)
    config = {"train_micro_batch_size_per_gpu": 1, "optimizer": {"type": "AdamW", "params": {"lr": 0.01}},
              "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0}}
    model = Concatenated()
    engine, *_ = nano.initialize(model=model, model_parameters=model.parameters(), config=config)
    engine.backward(engine(inputs))
    optimizer, failures = engine.optimizer, []
    plain_of = dict(zip(model.parameters(), plain.parameters()))
    if len(optimizer.buffers) != 2:  # one unit per holder
        failures.append(f"expected a unit per holder, got {len(optimizer.buffers)} buffers")
    for index, buffer in enumerate(optimizer.buffers):
        flat = torch.zeros(buffer.layout.padded_numel)
        for parameter, offset, numel in zip(buffer.parameters, buffer.layout.offsets, buffer.layout.parameter_numels):
            flat[offset:offset + numel] = plain_of[parameter].grad / world_size
        mine, theirs = optimizer.gradient_partitions[index], flat[buffer.partition_start:buffer.partition_end]
        if mine is None or not torch.allclose(mine, theirs, atol=1e-6):
            failures.append(f"world size {world_size}: buffer {index}'s gradient partition is not the plain gradients'")
    engine.destroy()
    return failures
