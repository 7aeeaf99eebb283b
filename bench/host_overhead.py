"""Benchmark: each engine's host (CPU) time per step on a model whose math is negligible, side by side.

    .venv/bin/python bench/host_overhead.py                     # W=1,2, stages 2,3, nano/official/fsdp2
    .venv/bin/python bench/host_overhead.py --gpus 1 --stages 3 --steps 6

The model is examples/models/qwen3-28-narrow.json: qwen3-0.6b's module tree (28 decoder layers, a
tied head) at a width of 64, so a step's time is the engine's bookkeeping (hooks, per-unit loops,
launches), not the math. That is what a real model's step pays
on top of its math, and what ranks engines when MFU is low (docs/throughput.md).

Phase 1: one `zero-lab compare` runs every impl on every (world size, stage) cell with the same
         model, data and seed (the harness's default configs; FSDP2 has no stage 1).
Phase 2: each run's median `step_cpu_ms` over its steps after the first two (the CPU time of the
         rank's process, all threads, max over ranks: what it computed, not what it waited for,
         so it varies less than wall time on a shared machine; docs/log-format.md).
Phase 3: print a table of milliseconds and nano's ratio to FSDP2 and to official per cell.
Goals (issue: host overhead): nano's CPU time per step <= FSDP2's at stage 3, and <= official's in
every cell. Exit code 1 when one is missed.
"""

from __future__ import annotations

import argparse
import sys

import pandas as pd

from compare_json import REPO, run_compare  # bench/compare_json.py

MODEL = "examples/models/qwen3-28-narrow.json"
IMPLS = ("nano", "official", "fsdp2")
SKIPPED_STEPS = 2  # step 1 builds the fetch trace and warms caches; step 2 is the first to follow it


def host_times(compare_dir: str) -> dict[tuple[int, int, str], float]:
    """Phase 2: (world size, stage, impl) -> median step_cpu_ms over the steps after the first two."""
    import zero_lab

    steps = zero_lab.load_steps(compare_dir)
    steady = steps[steps["step"] > SKIPPED_STEPS]
    medians = steady.groupby(["world_size", "stage", "impl"], observed=True)["step_cpu_ms"].median()
    return {(int(world), int(stage), str(impl)): float(value) for (world, stage, impl), value in medians.items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", default="1,2", help="world sizes (processes on CPU)")
    parser.add_argument("--stages", default="2,3")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--impls", default=",".join(IMPLS))
    parser.add_argument("--config", help="a DeepSpeed config for every impl (default: the harness's per stage), "
                                         "e.g. one whose zero_optimization.leaf_module names Qwen3DecoderLayer")
    args = parser.parse_args()

    result = run_compare("--gpus", args.gpus, "--device", "cpu", "--stages", args.stages, "--impls", args.impls,
                         "--model", str(REPO / MODEL), "--steps", str(args.steps),
                         *(["--config", args.config] if args.config else []))  # Phase 1
    times = host_times(result["compare_dir"])
    impls = args.impls.split(",")
    print(f"host CPU ms per step ({MODEL}, fp32, CPU, {args.steps} steps; median of steps after {SKIPPED_STEPS}"
          f"{'; config ' + args.config if args.config else ''})")
    print(f"{'W':>3} {'stage':>5} " + "".join(f"{impl:>10}" for impl in impls)
          + f"{'nano/fsdp2':>12}{'nano/official':>15}")
    missed = []
    for world_size in [int(size) for size in args.gpus.split(",")]:  # Phase 3
        for stage in [int(stage) for stage in args.stages.split(",")]:
            row = {impl: times.get((world_size, stage, impl)) for impl in impls}
            ratios = {other: row["nano"] / row[other] if row.get("nano") and row.get(other) else None
                      for other in ("fsdp2", "official")}
            print(f"{world_size:>3} {stage:>5} " + "".join(f"{row[impl]:>10.1f}" if row[impl] else f"{'-':>10}"
                                                     for impl in impls)
                  + "".join(f"{ratios[other]:>{width}.2f}" if ratios[other] else f"{'-':>{width}}"
                            for other, width in (("fsdp2", 12), ("official", 15))))
            if stage == 3 and ratios["fsdp2"] is not None and ratios["fsdp2"] > 1:
                missed.append(f"W={world_size} stage 3: nano / fsdp2 {ratios['fsdp2']:.2f} > 1")
            if ratios["official"] is not None and ratios["official"] > 1:
                missed.append(f"W={world_size} stage {stage}: nano / official {ratios['official']:.2f} > 1")
    for line in missed:
        print(f"missed: {line}")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
