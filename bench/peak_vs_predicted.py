"""Benchmark: the predicted peak (model states + activations + temporaries) against the peak each
impl really reaches, for the decoder presets at stages 0-3, measured side by side.

    .venv/bin/python bench/peak_vs_predicted.py                       # tiny and small, 2 CPU ranks, ~10 min on 2 cores
    .venv/bin/python bench/peak_vs_predicted.py --models tiny --no-fsdp2
    .venv/bin/python bench/peak_vs_predicted.py --models qwen3-0.6b --device cuda --gpus 1 --dtype bfloat16 --seq-len 512 --batch-size 1

Phase 1: per model, one `zero-lab compare` runs nano and official DeepSpeed on stages 0, 1, 2 and 3
         with the same data and seed, and one FSDP2 on its stages, 2 and 3 (`--no-fsdp2`: not);
         each row of its JSON carries the measured peak (`peak_alloc_max_mb`: max over ranks and
         steps) and the prediction (`predicted_peak_mb`, from the run's own `[model]` and `[zero]`
         lines; zero_lab/analysis/memory/peak_memory.py).
Phase 2: print model, stage, impl, measured, predicted and the error in percent; on CPU also a
         rank's resident high-water mark (`peak_reserved_max_mb`) against its predicted resident
         memory (`predicted_resident_mb`: the tensors, what the heap keeps of the freed ones, and
         what the process holds beside them; zero_lab/analysis/memory/resident.py). The heap's share
         grows over the first three steps, then holds: 4 steps by default.
Targets: nano's prediction within 15% of its measured peak (the prediction is nano's; official's
error shows what its extra buffers cost), and every impl's resident prediction within 10% of its
high-water mark (RESIDENT lines). Exit code 1 when a row misses either.
"""

from __future__ import annotations

import argparse
import sys

from compare_json import run_compare  # bench/compare_json.py

TARGET_PCT = 15.0
RESIDENT_PCT = 10.0  # the resident prediction's goal


def compare(model: str, args: argparse.Namespace) -> list[dict]:
    """Phase 1 for one model: nano and official at stages 0-3, then FSDP2 at its stages, 2 and 3."""
    flags = ["--gpus", str(args.gpus), "--device", args.device, "--model", model, "--steps", str(args.steps),
             "--dtype", args.dtype]
    flags += ["--seq-len", str(args.seq_len)] if args.seq_len else []
    flags += ["--batch-size", str(args.batch_size)] if args.batch_size else []
    rows = run_compare(*flags, "--stages", "0,1,2,3", "--impls", "nano,official")["rows"]
    return rows + (run_compare(*flags, "--stages", "2,3", "--impls", "fsdp2")["rows"] if args.fsdp2 else [])


def cell(value, digits: int = 1, signed: bool = False) -> str:
    return "-" if value is None else f"{value:+.{digits}f}" if signed else f"{value:.{digits}f}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="tiny,small")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--gpus", type=int, default=2)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--seq-len", type=int, default=None)
    parser.add_argument("--batch-size", type=int, default=None)
    parser.add_argument("--no-fsdp2", dest="fsdp2", action="store_false", help="nano and official alone")
    args = parser.parse_args()

    missed, resident_missed = [], []
    header = (f"{'model':<12}{'stage':>6}  {'impl':<9}{'measured MB':>12}{'predicted MB':>14}{'error %':>9}"
              f"{'resident MB':>13}{'predicted':>11}{'error %':>9}")
    print(header)
    print("-" * len(header))
    for model in args.models.split(","):
        for row in compare(model, args):  # Phase 2
            print(f"{model:<12}{row['stage']:>6}  {row['impl']:<9}{cell(row.get('peak_alloc_max_mb')):>12}"
                  f"{cell(row.get('predicted_peak_mb')):>14}{cell(row.get('peak_error_pct'), signed=True):>9}"
                  f"{cell(row.get('peak_reserved_max_mb')):>13}{cell(row.get('predicted_resident_mb')):>11}"
                  f"{cell(row.get('resident_error_pct'), signed=True):>9}")
            resident_error = row.get("resident_error_pct")
            if resident_error is not None and abs(resident_error) > RESIDENT_PCT:
                resident_missed.append(f"{model} stage {row['stage']} {row['impl']}: {resident_error:+.1f} %")
            error = row.get("peak_error_pct")
            if row["impl"] == "nano" and (row["status"] != "ok" or error is None or abs(error) > TARGET_PCT):
                missed.append(f"{model} stage {row['stage']}: {row['status']}, error {cell(error, signed=True)} %")
    for line in missed:
        print(f"MISSED: {line}")
    for line in resident_missed:
        print(f"RESIDENT over {RESIDENT_PCT:.0f}%: {line}")
    return 1 if missed or resident_missed else 0


if __name__ == "__main__":
    sys.exit(main())
