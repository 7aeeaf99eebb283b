"""Benchmark: what `--trace` costs a run, traced and untraced runs side by side.

    .venv/bin/python bench/trace_overhead.py                                  # nano, tiny, stage 3, W=2 on CPU
    .venv/bin/python bench/trace_overhead.py --impl official --stage 2 --model small --steps 10 --pairs 3

A traced run records every step here (--trace-steps 1-N: the worst case; the CLI's default traces
the first 3), so each of its steps pays for the timeline: a span per engine call and collective,
a counter event and a snapshot event (with its Python frames) per allocation and free.

Phase 1: --pairs pairs of harness runs under torchrun (W local ranks, gloo), in the order untraced,
         traced, traced, untraced, ... (a machine getting slower or faster falls on both halves).
Phase 2: of each run, the median of its `[opt_step]` step times after the first step (step_ms: wall
         time of the step, the slowest rank's, the harness's own sampling taken out), the run's wall
         time, and the CPU time of all its processes (what other work on the machine changes least).
Phase 3: one JSON line per run, then the median over pairs of traced / untraced for each figure.
Target (issue 34): step time with --trace within 5% of without (step-time ratio <= 1.05). Exit code
1 when the median step-time ratio misses it.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TARGET = 1.05
STEP_MS = re.compile(r"\[opt_step (\d+)\].* step_ms=([\d.]+)")


def children_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def one_run(args: argparse.Namespace, traced: bool) -> dict:
    """Phase 2 for one harness run: its median step time (after step 1), wall and CPU seconds."""
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(args.gpus),
               str(REPO / "harness" / "train.py"), "--impl", args.impl, "--device", "cpu", "--model-name", args.model,
               "--zero-stage", str(args.stage), "--steps", str(args.steps), "--batch-size", str(args.batch_size),
               "--seq-len", str(args.seq_len)]
    with tempfile.TemporaryDirectory() as directory:
        env = {**os.environ, "DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1",
               "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
        if traced:
            env.update({"ZERO_LAB_TRACE": directory, "ZERO_LAB_TRACE_STEPS": f"1-{args.steps}"})
        cpu_before, started = children_cpu_seconds(), time.perf_counter()
        done = subprocess.run(command, capture_output=True, text=True, env=env)
        wall, cpu = time.perf_counter() - started, children_cpu_seconds() - cpu_before
        if done.returncode:
            sys.exit(f"error: the {'traced' if traced else 'untraced'} run failed:\n{done.stderr[-3000:]}")
        files = sorted(path.name for path in Path(directory).iterdir()) if traced else []
        trace_bytes = sum(path.stat().st_size for path in Path(directory).iterdir()) if traced else 0
    steps = {int(step): float(ms) for step, ms in STEP_MS.findall(done.stdout)}
    if traced and len(files) != 2 * args.gpus:
        sys.exit(f"error: a traced run wrote {files}, not a trace and a snapshot per rank")
    return {"traced": traced, "median_step_ms": statistics.median(ms for step, ms in steps.items() if step > 1),
            "wall_s": wall, "cpu_s": cpu, "trace_mb": trace_bytes / 2**20}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--impl", default="nano", choices=("nano", "official", "fsdp2"))
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--stage", type=int, default=3)
    parser.add_argument("--gpus", type=int, default=2, help="ranks (local processes)")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--batch-size", type=int, default=2)
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--pairs", type=int, default=2)
    args = parser.parse_args()
    runs: dict[bool, list[dict]] = {True: [], False: []}
    for index in range(2 * args.pairs):  # Phase 1: untraced, traced, traced, untraced, ...
        traced = index % 4 in (1, 2)
        run = one_run(args, traced)
        runs[traced].append(run)
        print(json.dumps(run), flush=True)
    ratios = {figure: statistics.median(traced[figure] / plain[figure] for traced, plain in zip(runs[True], runs[False]))
              for figure in ("median_step_ms", "wall_s", "cpu_s")}
    print(json.dumps({"impl": args.impl, "model": args.model, "stage": args.stage, "world_size": args.gpus,
                      "steps": args.steps, "pairs": args.pairs, "step_time_ratio": ratios["median_step_ms"],
                      "wall_ratio": ratios["wall_s"], "cpu_ratio": ratios["cpu_s"], "target": TARGET,
                      "trace_mb_per_run": runs[True][0]["trace_mb"]}))
    return 0 if ratios["median_step_ms"] <= TARGET else 1


if __name__ == "__main__":
    sys.exit(main())
