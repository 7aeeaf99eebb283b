"""Benchmark: what CPU offload costs in step time, for nano and for official DeepSpeed, side by side.

    .venv/bin/python bench/offload_cost.py                     # tiny, 2 CPU ranks, stages 2 and 3
    .venv/bin/python bench/offload_cost.py --model small --steps 8 --device cuda --gpus 1 --dtype bfloat16

Phase 1: one `zero-lab compare` per offload choice (none, optimizer, and param at stage 3) runs
         both impls with the same model, data and seed.
Phase 2: print, per stage and offload, each impl's median step time (step 1 excluded), its ratio
         to the same impl without offload (the offload's cost), and the live bytes each impl
         measured (on CPU host and device are one memory: the bytes do not move, the path does).
No gate: this is a measurement to read (and to paste into a closing note).
"""

from __future__ import annotations

import argparse
import sys

from compare_json import run_compare, workload_parser  # bench/compare_json.py

MB = 2 ** 20
CASES = (("none", "2,3"), ("optimizer", "2,3"), ("param", "3"))


def compare(offload: str, stages: str, args: argparse.Namespace) -> dict:
    """Phase 1 for one offload choice."""
    return run_compare("--gpus", str(args.gpus), "--device", args.device, "--stages", stages, "--model", args.model,
                       "--steps", str(args.steps), "--dtype", args.dtype, "--offload", offload)


def main() -> int:
    parser = workload_parser(__doc__.splitlines()[0], steps=6)
    parser.add_argument("--dtype", default="float32")
    args = parser.parse_args()

    rows = {}
    for offload, stages in CASES:
        for row in compare(offload, stages, args)["rows"]:
            rows[(row["stage"], offload, row["impl"])] = row
    print(f"{'stage':>5} {'offload':>10} {'impl':>9} {'step ms':>9} {'x no offload':>13} {'live MB':>9}")
    for stage in (2, 3):
        for offload, stages in CASES:
            if str(stage) not in stages.split(","):
                continue
            for impl in ("nano", "official"):
                row, plain = rows.get((stage, offload, impl)), rows.get((stage, "none", impl))
                if not row or row["status"] != "ok" or not plain or not plain.get("step_ms"):
                    print(f"{stage:>5} {offload:>10} {impl:>9}   run failed")
                    continue
                cost = row["step_ms"] / plain["step_ms"]
                print(f"{stage:>5} {offload:>10} {impl:>9} {row['step_ms']:>9.1f} {cost:>13.2f} "
                      f"{row['alloc_max_mb']:>9.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
