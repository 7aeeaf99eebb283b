"""Benchmark: what `--trace` costs a step, traced and untraced steps side by side in one run.

    .venv/bin/python bench/trace_overhead.py                                  # nano, tiny, stage 3, W=2 on CPU
    .venv/bin/python bench/trace_overhead.py --impl official --stage 2 --model small --steps 12 --pairs 3

A traced step pays for its timeline: a span per engine call and collective, a counter event and a
snapshot event (with its Python stack) per allocation and free. On a shared machine two runs differ
by more than that (10% or more, docs/cli.md), so the cost is measured inside one run: a traced run
here traces every other step (--trace-steps 2,4,6,...), and each traced step is compared with the
untraced step just before it, under the same load, in the same process.

Phase 1: --pairs pairs of harness runs under torchrun (W local ranks, gloo), in the order untraced,
         traced, traced, untraced, ... (a machine getting slower or faster falls on both halves).
Phase 2: of each run, its `[opt_step]` step times (step_ms: wall time of the step, the slowest
         rank's, the harness's own sampling taken out), the run's wall time, and the CPU time of all
         its processes; and its neighbour ratios t(k+1) / t(k) for odd k >= 3 (step 1 and 2 are
         start-up): in a traced run, a traced step over the untraced one before it.
Phase 3: one JSON line per run, then
         step_time_ratio   the median neighbour ratio of the traced runs over that of the untraced
                           runs (whose even steps are no different from their odd ones: it takes
                           out any rhythm of the steps themselves), with its bootstrap 95% interval
                           (runs, then pairs, resampled: zero_lab/analysis/runs/step_times.py);
         run_step_time_ratio  the traced steps' median over the untraced runs' steady median (run
                           against run: as noisy as the machine);
         wall_ratio, cpu_ratio  traced run over untraced run, median over pairs (half the steps traced).
Target (issue 34): step time with --trace within 5% of without (step_time_ratio <= 1.05). Exit code
1 when the ratio misses it.
docs/trace.md's table quotes the summary line of a run per model, kept as reports/trace-overhead-<model>.json.
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

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from zero_lab.analysis.runs.speed.step_times import ratio_interval, steady_times  # noqa: E402 (after the path, as a script)

TARGET = 1.05
STEP_MS = re.compile(r"\[opt_step (\d+)\].* step_ms=([\d.]+).* step_cpu_ms=([\d.]+)")


def children_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def traced_steps(steps: int) -> list[int]:
    return list(range(2, steps + 1, 2))


def neighbour_ratios(times: dict[int, float]) -> list[float]:
    """t(k+1) / t(k) for odd k >= 3: in a traced run, each traced (even) step over the untraced step before it."""
    return [times[step + 1] / times[step] for step in range(3, max(times), 2) if step + 1 in times]


def neighbour_ratio(runs: dict[bool, list[dict]], key: str) -> tuple[float, tuple]:
    """The traced runs' median neighbour ratio over the untraced runs', and its bootstrap 95% interval."""
    traced, plain = ([run[key] for run in runs[side]] for side in (True, False))
    return (float(np.median(np.concatenate(traced)) / np.median(np.concatenate(plain))),
            ratio_interval(traced, plain) or (None, None))


def one_run(args: argparse.Namespace, traced: bool) -> dict:
    """Phase 2 for one harness run: its step times and neighbour ratios, wall and CPU seconds."""
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(args.gpus),
               str(REPO / "harness" / "train.py"), "--impl", args.impl, "--device", "cpu", "--model-name", args.model,
               "--zero-stage", str(args.stage), "--steps", str(args.steps), "--batch-size", str(args.batch_size),
               "--seq-len", str(args.seq_len)]
    with tempfile.TemporaryDirectory() as directory:
        env = {**os.environ, "DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1",
               "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
        if traced:
            env.update({"ZERO_LAB_TRACE": directory,
                        "ZERO_LAB_TRACE_STEPS": ",".join(map(str, traced_steps(args.steps)))})
        cpu_before, started = children_cpu_seconds(), time.perf_counter()
        done = subprocess.run(command, capture_output=True, text=True, env=env)
        wall, cpu = time.perf_counter() - started, children_cpu_seconds() - cpu_before
        if done.returncode:
            sys.exit(f"error: the {'traced' if traced else 'untraced'} run failed:\n{done.stderr[-3000:]}")
        files = sorted(path.name for path in Path(directory).iterdir()) if traced else []
        trace_bytes = sum(path.stat().st_size for path in Path(directory).iterdir()) if traced else 0
    lines = STEP_MS.findall(done.stdout)
    times = {int(step): float(ms) for step, ms, _ in lines}
    cpu_times = {int(step): float(cpu_ms) for step, _, cpu_ms in lines}
    if traced and len(files) != 2 * args.gpus:
        sys.exit(f"error: a traced run wrote {files}, not a trace and a snapshot per rank")
    return {"traced": traced, "step_ms": [times[step] for step in sorted(times)],
            "step_cpu_ms": [cpu_times[step] for step in sorted(cpu_times)],
            "neighbour_ratios": neighbour_ratios(times), "neighbour_cpu_ratios": neighbour_ratios(cpu_times),
            "wall_s": wall, "cpu_s": cpu, "trace_mb": trace_bytes / 2**20}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--impl", default="nano", choices=("nano", "official", "fsdp2"))
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--stage", type=int, default=3)
    parser.add_argument("--gpus", type=int, default=2, help="ranks (local processes)")
    parser.add_argument("--steps", type=int, default=12, help="optimizer steps per run (at least 4)")
    parser.add_argument("--batch-size", type=int, default=2)
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--pairs", type=int, default=3)
    args = parser.parse_args()
    if args.steps < 4:
        parser.error("--steps must be at least 4: steps 3 and 4 form the first traced/untraced pair")
    runs: dict[bool, list[dict]] = {True: [], False: []}
    for index in range(2 * args.pairs):  # Phase 1: untraced, traced, traced, untraced, ...
        traced = index % 4 in (1, 2)
        run = one_run(args, traced)
        runs[traced].append(run)
        print(json.dumps(run), flush=True)
    # Phase 3
    step_ratio, interval = neighbour_ratio(runs, "neighbour_ratios")
    cpu_step_ratio, cpu_interval = neighbour_ratio(runs, "neighbour_cpu_ratios")
    traced_times = np.concatenate([[run["step_ms"][step - 1] for step in traced_steps(args.steps) if step > 2]
                                   for run in runs[True]])
    plain_times = np.concatenate([steady_times(run["step_ms"]) for run in runs[False]])
    run_ratios = {figure: statistics.median(traced[figure] / plain[figure]
                                            for traced, plain in zip(runs[True], runs[False]))
                  for figure in ("wall_s", "cpu_s")}
    print(json.dumps({"impl": args.impl, "model": args.model, "stage": args.stage, "world_size": args.gpus,
                      "steps": args.steps, "pairs": args.pairs, "step_time_ratio": step_ratio,
                      "step_time_ratio_low": interval[0], "step_time_ratio_high": interval[1],
                      "step_cpu_time_ratio": cpu_step_ratio, "step_cpu_time_ratio_low": cpu_interval[0],
                      "step_cpu_time_ratio_high": cpu_interval[1],
                      "run_step_time_ratio": float(np.median(traced_times) / np.median(plain_times)),
                      "wall_ratio": run_ratios["wall_s"], "cpu_ratio": run_ratios["cpu_s"], "target": TARGET,
                      "trace_mb_per_run": runs[True][0]["trace_mb"]}))
    return 0 if step_ratio <= TARGET else 1


if __name__ == "__main__":
    sys.exit(main())
