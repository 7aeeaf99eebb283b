"""Benchmark: the peak while building a model under `zero_lab.nano.zero.Init`, against its bound.

    .venv/bin/python bench/init_peak.py                          # qwen3-0.6b, fp32, 2 CPU ranks
    .venv/bin/python bench/init_peak.py --model small --world-size 3

Phase 1: spawn N gloo ranks; each builds the preset's Hugging Face model (random init, as the
         harness does) inside `nano.zero.Init()`, with the live-storage tracker of the harness's
         memory meter watching every tensor from outside.
Phase 2: each rank prints its construction peak beside the bound issue 8 sets - 1/N of the model
         plus its largest layer - made exact: the built model's slices (padded to N), the largest
         module's own parameters whole (the one being initialised before it is partitioned), and
         the model's buffers (rotary frequencies), which Init leaves whole. A tied model's head
         is built untied by Hugging Face and tied afterwards: while it is built, the embedding's
         slice and the whole head are alive, which the bound covers.
Exit code 1 when a rank's peak exceeds its bound.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as multiprocessing

MB = 2**20


def build_under_init(rank: int, world_size: int, port: int, model_name: str, results) -> None:
    """Phase 1 on one rank, then its Phase 2 line."""
    import zero_lab.nano as nano
    from zero_lab.workload.meters.memory_meter import LiveStorageTracker
    from zero_lab.workload.models import build_model

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world_size),
                      LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    with LiveStorageTracker("cpu") as tracker:
        start = tracker.live_bytes
        with nano.zero.Init() as init:
            model = build_model(model_name, seed=0)  # the harness's builder: random init, fp32
        peak = tracker.peak_bytes - start
    width = 4  # fp32 parameters

    def whole_numel(parameter: torch.nn.Parameter) -> int:
        return torch.Size(parameter.zero_lab_shape).numel()

    largest = max(sum(whole_numel(p) for p in module.parameters(recurse=False)) for module in model.modules()) * width
    buffers = sum(buffer.untyped_storage().nbytes() for buffer in model.buffers())
    whole = sum(whole_numel(parameter) for parameter in model.parameters()) * width
    slices = sum(parameter.zero_lab_init_partition.untyped_storage().nbytes() for parameter in model.parameters())
    bound = slices + largest + buffers
    results.put((rank, peak, bound, slices, largest, buffers, whole))
    dist.barrier()
    dist.destroy_process_group()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="qwen3-0.6b", help="a preset of zero_lab.workload.models")
    parser.add_argument("--world-size", type=int, default=2)
    args = parser.parse_args()

    from zero_lab.launch.ports import free_port

    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    port = free_port()
    ranks = [context.Process(target=build_under_init, args=(rank, args.world_size, port, args.model, results))
             for rank in range(args.world_size)]
    for process in ranks:
        process.start()
    lines = sorted(results.get(timeout=1800) for _ in ranks)
    for process in ranks:
        process.join()

    print(f"zero.Init construction peak per rank ({args.model}, fp32, W={args.world_size}), MB")
    print(f"{'rank':>4}{'peak':>10}{'bound':>10}{'slices':>10}{'largest':>10}{'buffers':>10}{'whole':>10}"
          f"{'peak/whole':>12}")
    over = []
    for rank, peak, bound, slices, largest, buffers, whole in lines:
        print(f"{rank:>4}{peak / MB:>10.1f}{bound / MB:>10.1f}{slices / MB:>10.1f}{largest / MB:>10.1f}"
              f"{buffers / MB:>10.3f}{whole / MB:>10.1f}{peak / whole:>12.3f}")
        if peak > bound:
            over.append(f"rank {rank}: peak {peak} B > bound {bound} B")
    for line in over:
        print(f"MISSED: {line}")
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main())
