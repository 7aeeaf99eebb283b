"""Benchmark: what `--check-collectives` (torch's TORCH_DISTRIBUTED_DEBUG=DETAIL) costs per step, side by side.

    .venv/bin/python bench/check_collectives_cost.py                  # nano, stage 3, tiny, 2 ranks, CPU
    .venv/bin/python bench/check_collectives_cost.py --impl official --stage 2 --repeats 3

The check all-gathers a fingerprint of every collective (its operation, shapes and dtypes) before
issuing it, so it costs a small collective per real one: most at stage 3, whose many gathers are
each small.

Phase 1: `zero-lab run` the same cell with and without the check, alternating (without, with,
         without, ...) `--repeats` times each, so a machine that slows down over the minutes slows
         both alike.
Phase 2: each run's median step time after start-up (its summary's `step_ms`), pooled per setting
         as the median of the runs'.
Phase 3: print both and their ratio (checked / unchecked). There is no goal: the ratio says what the
         check costs on this machine and cell.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "runs" / "bench" / "check-collectives"


def run_once(args: argparse.Namespace, checked: bool, name: str) -> float:
    """One `zero-lab run`; its median step time in ms (exit naming its error if it failed)."""
    command = [str(Path(sys.executable).with_name("zero-lab")), "run", "--impl", args.impl, "--stage", str(args.stage),
               "--gpus", "2", "--device", "cpu", "--model", args.model, "--steps", str(args.steps), "--out", str(OUT),
               "--name", name, "--format", "json", *(["--check-collectives"] if checked else [])]
    done = subprocess.run(command, capture_output=True, text=True, cwd=REPO)
    summary_path = OUT / name / "summary.json"
    if done.returncode != 0 or not summary_path.is_file():
        sys.exit(f"error: {' '.join(command[1:])} exited {done.returncode}:\n{done.stderr[-2000:]}")
    return json.loads(summary_path.read_text())["step_ms"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--impl", default="nano")
    parser.add_argument("--stage", type=int, default=3)
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    stamp = time.strftime("%Y%m%d-%H%M%S")
    times: dict[bool, list[float]] = {False: [], True: []}
    for repeat in range(args.repeats):  # Phase 1
        for checked in (False, True):
            times[checked].append(run_once(args, checked, f"{stamp}-{'checked' if checked else 'plain'}-{repeat}"))
    unchecked, checked = (statistics.median(times[setting]) for setting in (False, True))  # Phase 2
    print(f"--check-collectives, {args.impl} stage {args.stage}, {args.model}, 2 ranks, CPU; median step ms of "
          f"{args.repeats} runs each")  # Phase 3
    print(f"  without: {unchecked:.1f} ms   with: {checked:.1f} ms   ratio {checked / unchecked:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
