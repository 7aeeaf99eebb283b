"""Benchmark: nano's step time as a ratio of official DeepSpeed's, at several world sizes, side by side.

    .venv/bin/python bench/step_time_vs_official.py                       # tiny, stages 1,2, W=2,4,8 on CPU
    .venv/bin/python bench/step_time_vs_official.py --gpus 2,4 --stages 1,2 --steps 20 --model small

Phase 1: one `zero-lab compare` runs both impls on every (world size, stage) cell with the same model,
         data and seed and the harness's default configs; each cell's median step time excludes
         step 1 (start-up work).
Phase 2: print a table, world sizes down and stages across, of nano / official median step time,
         with each impl's milliseconds, and the loss parity of every cell.
Target (issue 7): every ratio <= 1.00 on CPU. Exit code 1 when one is missed, so a person or CI can
gate on it. On a shared 2-core machine W=8 means eight ranks on two cores: rerun before trusting
a single miss.
"""

from __future__ import annotations

import argparse
import sys

from compare_json import run_compare  # bench/compare_json.py


def compare(args: argparse.Namespace) -> dict:
    """Phase 1: one compare over every cell, parsed from its JSON."""
    return run_compare("--gpus", args.gpus, "--device", args.device, "--stages", args.stages, "--model", args.model,
                       "--steps", str(args.steps), "--dtype", args.dtype)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", default="2,4,8", help="world sizes (processes on CPU)")
    parser.add_argument("--stages", default="1,2")
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32")
    args = parser.parse_args()

    result = compare(args)
    rows = {(row["world_size"], row["stage"], row["impl"]): row for row in result["rows"]}
    parity = {(delta["world_size"], delta["stage"]): delta["loss_parity"] for delta in result["deltas"]}
    stages = [int(stage) for stage in args.stages.split(",")]
    print(f"step time, nano / official ({args.model}, {args.dtype}, {args.device}, {args.steps} steps; "
          "median without step 1; ms in brackets)")
    print(f"{'W':>3}" + "".join(f"{f'stage {stage}':>32}" for stage in stages))
    missed = []
    for world_size in [int(size) for size in args.gpus.split(",")]:
        cells = []
        for stage in stages:
            nano, official = rows.get((world_size, stage, "nano")), rows.get((world_size, stage, "official"))
            if not nano or not official or not nano.get("step_ms") or not official.get("step_ms"):
                cells.append(f"{'run failed':>32}")
                missed.append(f"W={world_size} stage {stage}: a run failed")
                continue
            ratio = nano["step_ms"] / official["step_ms"]
            cells.append(f"{ratio:>10.2f} ({nano['step_ms']:.0f} / {official['step_ms']:.0f} ms)".rjust(32))
            if ratio > 1.0:
                missed.append(f"W={world_size} stage {stage}: ratio {ratio:.2f} > 1")
            if not parity.get((world_size, stage)):
                missed.append(f"W={world_size} stage {stage}: losses differ")
        print(f"{world_size:>3}" + "".join(cells))
    for line in missed:
        print(f"MISSED: {line}")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
