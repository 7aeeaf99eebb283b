"""What every bench script does first: run `zero-lab compare ... --format json` and read its JSON."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def run_compare(*flags: str) -> dict:
    """One compare with these flags (run directories under runs/bench), or exit naming its error."""
    command = [str(Path(sys.executable).with_name("zero-lab")), "compare", *flags, "--format", "json",
               "--out", str(REPO / "runs" / "bench")]
    finished = subprocess.run(command, capture_output=True, text=True, cwd=REPO)
    if not finished.stdout.strip():
        sys.exit(f"error: zero-lab compare printed nothing (exit {finished.returncode}):\n{finished.stderr[-2000:]}")
    return json.loads(finished.stdout)


def workload_parser(description: str, steps: int) -> argparse.ArgumentParser:
    """The options every bench script shares: what to run and where (one model, CPU ranks by default)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--steps", type=int, default=steps)
    parser.add_argument("--gpus", type=int, default=2)
    parser.add_argument("--device", default="cpu")
    return parser


def ratio(numerator, denominator) -> float:
    return float("nan") if not numerator or not denominator else numerator / denominator
