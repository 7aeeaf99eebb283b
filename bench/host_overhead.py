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
With `--repeat N` Phases 1-3 run N times and Phase 4 prints each cell's ratios over the N runs and
their median: on a shared 2-core machine one run's ratio moves by 15-25% (the impls run one after
another, so a busy spell lands on one of them), and the goals read the median.
Goals (issue: host overhead): nano's CPU time per step <= FSDP2's at stage 3, and <= official's in
every cell. Exit code 1 when one is missed.
"""

from __future__ import annotations

import argparse
import statistics
import sys


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
    parser.add_argument("--repeat", type=int, default=1, help="runs of the whole comparison; the goals read the "
                                                                  "median ratio over them")
    parser.add_argument("--config", help="a DeepSpeed config for every impl (default: the harness's per stage), "
                                         "e.g. one whose zero_optimization.leaf_module names Qwen3DecoderLayer")
    args = parser.parse_args()

    impls = args.impls.split(",")
    cells = [(int(world_size), int(stage)) for world_size in args.gpus.split(",") for stage in args.stages.split(",")]
    ratios: dict[tuple[int, int, str], list[float]] = {}
    for _ in range(args.repeat):
        result = run_compare("--gpus", args.gpus, "--device", "cpu", "--stages", args.stages, "--impls", args.impls,
                             "--model", str(REPO / MODEL), "--steps", str(args.steps),
                             *(["--config", args.config] if args.config else []))  # Phase 1
        times = host_times(result["compare_dir"])
        print(f"host CPU ms per step ({MODEL}, fp32, CPU, {args.steps} steps; median of steps after {SKIPPED_STEPS}"
              f"{'; config ' + args.config if args.config else ''})")
        print(f"{'W':>3} {'stage':>5} " + "".join(f"{impl:>10}" for impl in impls)
              + f"{'nano/fsdp2':>12}{'nano/official':>15}")
        for world_size, stage in cells:  # Phase 3
            row = {impl: times.get((world_size, stage, impl)) for impl in impls}
            ratio = {other: row["nano"] / row[other] if row.get("nano") and row.get(other) else None
                     for other in ("fsdp2", "official")}
            for other, value in ratio.items():
                if value is not None:
                    ratios.setdefault((world_size, stage, other), []).append(value)
            print(f"{world_size:>3} {stage:>5} " + "".join(f"{row[impl]:>10.1f}" if row[impl] else f"{'-':>10}"
                                                     for impl in impls)
                  + "".join(f"{ratio[other]:>{width}.2f}" if ratio[other] else f"{'-':>{width}}"
                            for other, width in (("fsdp2", 12), ("official", 15))))
    if args.repeat > 1:  # Phase 4
        print(f"nano's ratio over {args.repeat} runs (median)")
        for (world_size, stage, other), values in ratios.items():
            print(f"W={world_size} stage {stage} nano/{other}: " + " ".join(f"{value:.2f}" for value in values)
                  + f"  (median {statistics.median(values):.2f})")
    missed = [f"W={world_size} stage {stage}: nano / {other} {statistics.median(values):.2f} > 1"
              for (world_size, stage, other), values in ratios.items()
              if statistics.median(values) > 1 and (other == "official" or stage == 3)]
    for line in missed:
        print(f"missed: {line}")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
