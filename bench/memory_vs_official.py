"""Benchmark: nano's memory and step time as ratios of official DeepSpeed's, measured side by side.

    .venv/bin/python bench/memory_vs_official.py                 # tiny model, 2 CPU ranks, ~4 min
    .venv/bin/python bench/memory_vs_official.py --model small --steps 8 --device cuda --gpus 2

Phase 1: for each precision, one `zero-lab compare` runs both impls on stages 0, 1, 2 and 3 with
         the same model, data and seed (the harness's configs: zero3.json for stage 3); memory comes
         from the harness's external tracker (live tensor storage on CPU, torch.cuda statistics
         on GPU), identical for both impls.
Phase 2: print, per precision and stage, nano / official for live bytes after a step, peak bytes
         within a step, and median step time, plus live bytes per parameter for each impl.
Targets: every memory ratio <= 1.00, and < 1.00 for live bytes in fp32 at stages 1/2 (issue 2);
at stage 3 live <= 0.65 in fp32 and <= 0.90 in bf16 (issue 8).
Exit code 1 when a memory target is missed, so CI or a person can gate on it.
"""

from __future__ import annotations

import argparse
import sys

from compare_json import ratio, run_compare, workload_parser  # bench/compare_json.py

MB = 2 ** 20


def compare(precision: str, args: argparse.Namespace) -> dict:
    """Phase 1: one compare run for one precision, parsed from its JSON."""
    return run_compare("--gpus", str(args.gpus), "--device", args.device, "--stages", "0,1,2,3", "--model",
                       args.model, "--steps", str(args.steps), "--dtype", precision)


def main() -> int:
    parser = workload_parser(__doc__.splitlines()[0], steps=6)
    parser.add_argument("--precisions", default="float32,bfloat16")
    args = parser.parse_args()

    missed = []
    header = (f"{'precision':<10}{'stage':>6}{'live nano/off':>15}{'peak nano/off':>15}{'step time n/o':>15}"
              f"{'live B/param nano':>19}{'official':>10}")
    print(header)
    print("-" * len(header))
    for precision in args.precisions.split(","):
        result = compare(precision, args)
        rows = {(row["stage"], row["impl"]): row for row in result["rows"]}
        for stage in (0, 1, 2, 3):
            nano, official = rows.get((stage, "nano")), rows.get((stage, "official"))
            if not nano or not official or nano["status"] != "ok" or official["status"] != "ok":
                missed.append(f"{precision} stage {stage}: a run failed ({nano and nano['status']}, "
                              f"{official and official['status']})")
                continue
            live = ratio(nano["alloc_max_mb"], official["alloc_max_mb"])
            peak = ratio(nano["peak_alloc_max_mb"], official["peak_alloc_max_mb"])
            speed = ratio(nano["step_ms"], official["step_ms"])
            per_param = [row["alloc_max_mb"] * MB / row["params"] for row in (nano, official)]
            print(f"{precision:<10}{stage:>6}{live:>15.3f}{peak:>15.3f}{speed:>15.3f}"
                  f"{per_param[0]:>19.2f}{per_param[1]:>10.2f}")
            if live > 1.0 or peak > 1.0:
                missed.append(f"{precision} stage {stage}: nano holds more than official (live {live:.3f}, "
                              f"peak {peak:.3f})")
            if precision == "float32" and stage > 0 and not live < 1.0:
                missed.append(f"float32 stage {stage}: live ratio {live:.3f} is not below 1")
            stage3_live_target = {"float32": 0.65, "bfloat16": 0.90}.get(precision)
            if stage == 3 and stage3_live_target and live > stage3_live_target:
                missed.append(f"{precision} stage 3: live ratio {live:.3f} > {stage3_live_target}")
    for line in missed:
        print(f"MISSED: {line}")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
