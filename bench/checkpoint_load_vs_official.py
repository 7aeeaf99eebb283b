"""Benchmark: how long nano takes to load a checkpoint, as a ratio of official DeepSpeed's, same world size.

    .venv/bin/python bench/checkpoint_load_vs_official.py                     # small, 2 CPU ranks, stages 1-3
    .venv/bin/python bench/checkpoint_load_vs_official.py --model tiny --stages 2 --repeats 3

Phase 1: per stage and impl, one `zero-lab run` trains one step and saves (`--save-dir`); then
         `--repeats` runs each resume that checkpoint at the same world size (`--resume`), and the
         rank-0 `[ckpt]` load line gives the seconds of its `load_checkpoint`. The two impls'
         resumes alternate, so load on the machine falls on both alike; the median counts.
Phase 2: print a table, stages down, of each impl's median load seconds and nano / official.
Target (issue 22 part 3): every ratio <= 1.00. Exit code 1 when one is missed. On a shared
2-core machine the seconds move with the load: rerun before trusting a single miss.
"""

from __future__ import annotations

import shutil
import statistics
import subprocess
import sys
from pathlib import Path

from compare_json import REPO, workload_parser  # bench/compare_json.py

sys.path.insert(0, str(REPO))
from zero_lab.analysis.runs.logparse import parse_file  # noqa: E402 (after the path, as a script)
from zero_lab.analysis.runs.rundir import rank0_log  # noqa: E402

IMPLS = ("nano", "official")
OUT = REPO / "runs" / "bench" / "checkpoint-load"


def run(args, impl: str, stage: int, steps: int, save_dir: Path, name: str, resume: bool) -> Path:
    """One `zero-lab run`; its run directory, or exit naming its error."""
    command = [str(Path(sys.executable).with_name("zero-lab")), "run", "--impl", impl, "--gpus", str(args.gpus),
               "--device", args.device, "--model", args.model, "--stage", str(stage), "--steps", str(steps),
               "--dtype", args.dtype, "--save-dir", str(save_dir), "--out", str(OUT), "--name", name]
    finished = subprocess.run(command + (["--resume"] if resume else []), capture_output=True, text=True, cwd=REPO)
    if finished.returncode != 0:
        sys.exit(f"error: {' '.join(command)} exited {finished.returncode}:\n{finished.stderr[-2000:]}")
    return OUT / name


def load_seconds(run_dir: Path) -> float:
    loads = [row for row in parse_file(rank0_log(run_dir)).checkpoints if row.get("action") == "load"]
    if not loads:
        sys.exit(f"error: {run_dir} has no [ckpt] load line")
    return float(loads[0]["seconds"])


def main() -> int:
    parser = workload_parser(__doc__.splitlines()[0], steps=1)
    parser.set_defaults(model="small")
    parser.add_argument("--stages", default="1,2,3")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--repeats", type=int, default=3, help="resumes per impl and stage (the median counts)")
    args = parser.parse_args()
    shutil.rmtree(OUT, ignore_errors=True)  # this script's own runs and checkpoints, from a run before
    checkpoints = OUT / "checkpoints"
    stages = [int(stage) for stage in args.stages.split(",")]
    seconds = {}
    for stage in stages:  # Phase 1
        for impl in IMPLS:
            run(args, impl, stage, args.steps, checkpoints / f"{impl}-stage{stage}", f"{impl}-stage{stage}-save", False)
        for repeat in range(args.repeats):
            for impl in IMPLS:
                run_dir = run(args, impl, stage, args.steps + 1, checkpoints / f"{impl}-stage{stage}",
                              f"{impl}-stage{stage}-load{repeat}", True)
                seconds.setdefault((stage, impl), []).append(load_seconds(run_dir))
                shutil.rmtree(checkpoints / f"{impl}-stage{stage}" / f"global_step{args.steps + 1}",
                              ignore_errors=True)  # the resume saved again: keep loading the first save
                (checkpoints / f"{impl}-stage{stage}" / "latest").write_text(f"global_step{args.steps}")
    print(f"checkpoint load seconds, nano / official ({args.model}, {args.dtype}, {args.device}, W={args.gpus}, "
          f"same world size as saved; median of {args.repeats}, all in brackets)")  # Phase 2
    print(f"{'stage':>5} {'nano s':>8} {'official s':>11} {'ratio':>7}   runs (nano | official)")
    missed = []
    for stage in stages:
        nano, official = (statistics.median(seconds[(stage, impl)]) for impl in IMPLS)
        ratio = nano / official
        runs = " | ".join(", ".join(f"{value:.2f}" for value in seconds[(stage, impl)]) for impl in IMPLS)
        print(f"{stage:>5} {nano:>8.2f} {official:>11.2f} {ratio:>7.2f}   ({runs})")
        if ratio > 1.0:
            missed.append(f"stage {stage}: ratio {ratio:.2f} > 1")
    for line in missed:
        print(f"missed: {line}")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
