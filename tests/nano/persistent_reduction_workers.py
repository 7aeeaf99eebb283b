"""Per-rank body: stage 3's persistent buffers reduce their gradients together (`nano.spanning_layout`).

TrapNet's 14 persistent parameters (norms and biases, 6 elements each) are 14 always-whole buffers.
Their gradients must reach the fp32 gradient partitions in as few reduce-scatter calls as
`reduce_bucket_size` allows (one, when they fit), each partition equal to the single-process
reference's gradient, and training must still follow the reference step by step.
"""

from __future__ import annotations

import copy

import torch

import zero_lab.nano as nano
from tests.nano.stage3_reference import TokenReference, build_trapnet, decay_groups, token_batch, token_loss
from tests.nano.stage3_workers import MICRO_SIZE, TOLERANCE, compare_whole, stage3_config
from tests.nano.workers import LR, WEIGHT_DECAY

STEPS = 3


def packed_groups(numels: list[int], bucket: int) -> int:
    """How many buckets of at most `bucket` elements the persistent buffers fill, in order."""
    groups, filled = 0, bucket + 1
    for numel in numels:
        if filled + numel > bucket:
            groups, filled = groups + 1, 0
        filled += numel
    return groups


def reference_partition(buffer, reference_of) -> torch.Tensor:
    """The reference's gradient of `buffer`'s parameters, laid out as the buffer and cut to this rank's partition."""
    flat = torch.zeros(buffer.layout.padded_numel)
    for parameter, offset, numel in zip(buffer.parameters, buffer.layout.offsets, buffer.layout.parameter_numels):
        gradient = reference_of[parameter].grad
        if gradient is not None:
            flat[offset:offset + numel] = gradient.reshape(-1)
    return flat[buffer.partition_start:buffer.partition_end]


def persistent_reduction_worker(rank: int, world_size: int) -> list[str]:
    failures = []
    for accumulation, overlap, bucket in ((1, False, 500_000_000), (2, True, 500_000_000), (1, True, 24)):
        label = f"world size {world_size} accumulation {accumulation} overlap {overlap} bucket {bucket}"
        initial = build_trapnet()
        reference = TokenReference(initial, LR, WEIGHT_DECAY, 0.0)
        model = copy.deepcopy(initial)
        engine, *_ = nano.initialize(model=model, model_parameters=decay_groups(model, WEIGHT_DECAY),
                                     config=stage3_config(accumulation=accumulation, overlap=overlap, bucket=bucket))
        optimizer = engine.optimizer
        reference_of = dict(zip(model.parameters(), reference.model.parameters()))
        persistent = [index for index, buffer in enumerate(optimizer.buffers) if buffer not in
                      {sharded for entry in optimizer.gathering.entries for sharded in entry.buffers}]
        sharded_buckets = sum(len(buffer.layout.bucket_ranges(bucket)) for index, buffer in enumerate(optimizer.buffers)
                              if index not in persistent)
        numels = [optimizer.buffers[index].layout.padded_numel for index in persistent]
        expected_calls = accumulation * (sharded_buckets + packed_groups(numels, bucket))
        if bucket > sum(numels) and packed_groups(numels, bucket) != 1:
            failures.append(f"{label}: the persistent buffers should fit in one bucket")
        for step in range(STEPS):
            optimizer.collectives.reset_stats()
            for micro in range(accumulation):
                engine.backward(token_loss(engine, token_batch(step, micro, rank, MICRO_SIZE)))
                if micro < accumulation - 1:
                    engine.step()
            calls = optimizer.collectives.stats().get("reduce_scatter", {}).get("calls", 0)
            if world_size > 1 and calls != expected_calls:
                failures.append(f"{label} step {step}: {calls} reduce-scatter calls, expected {expected_calls} "
                                f"({sharded_buckets} sharded buckets and the persistent buffers' per micro-step)")
            reference.step(step, world_size, accumulation, MICRO_SIZE)
            for index in persistent:
                mine = optimizer.gradient_partitions[index]
                theirs = reference_partition(optimizer.buffers[index], reference_of)
                difference = (mine - theirs).abs().max().item()
                if not difference <= TOLERANCE:
                    failures.append(f"{label} step {step}: persistent buffer {index}'s gradient partition is "
                                    f"{difference:.3g} off the reference")
            engine.step()
            compare_whole(model, reference, failures, f"{label} step {step}", step + 1)
    return failures
