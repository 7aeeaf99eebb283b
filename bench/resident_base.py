"""Benchmark: what a CPU rank holds resident beside its tensors once its engine is built, per impl, measured
on a tiny run and kept in zero_lab/analysis/memory/resident_base.json for the preflight
(`analysis.memory.resident`).

    .venv/bin/python bench/resident_base.py            # measure, print, and write the table
    .venv/bin/python bench/resident_base.py --check    # measure and print against the table; exit 1 if >25% off

Phase 1: one `zero-lab compare` per impl on the tiny model, 2 CPU ranks, 3 steps: nano and official at stage 0
         (no buffer allocated and left untouched), FSDP2 at stage 2 (its first).
Phase 2: per impl, the `[model]` line's `rss_beside_tensors_mb`: the interpreter, torch and its libraries,
         the engine and its threads (`at_initialize_mb`, what the preflight adds before launch). Printed
         beside it: what the steps then added beside the live tensors (the resident high-water mark less
         the tensors' peak and that reading) against what the heap is predicted to keep
         (`analysis.memory.heap_kept`).
Phase 3: write the table, or with --check compare the first column against it.
"""

from __future__ import annotations

import argparse
import json
import sys

from compare_json import REPO, run_compare  # bench/compare_json.py

TABLE = REPO / "zero_lab" / "analysis" / "memory" / "resident_base.json"
CHECK_PCT = 25.0
STAGE_OF_IMPL = {"nano": 0, "official": 0, "fsdp2": 2}


def measure() -> tuple[dict[str, float], dict[str, tuple[float, float]]]:
    """Phases 1-2: {impl: MB at initialize}, {impl: (MB the steps added beside the tensors, MB predicted kept)}."""
    base, kept = {}, {}
    for impl, stage in STAGE_OF_IMPL.items():
        (row,) = run_compare("--gpus", "2", "--device", "cpu", "--model", "tiny", "--steps", "3", "--stages",
                             str(stage), "--impls", impl, "--name", f"resident-{impl}")["rows"]
        if row["status"] != "ok":
            sys.exit(f"error: the {impl} run ended {row['status']}: {row.get('error')}")
        base[impl] = round(row["rss_beside_tensors_mb"], 1)
        added = row["peak_reserved_max_mb"] - row["peak_alloc_max_mb"] - row["rss_beside_tensors_mb"]
        predicted = row["predicted_resident_mb"] - row["predicted_peak_mb"] - row["rss_beside_tensors_mb"]
        kept[impl] = (added, predicted)
    return base, kept


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare with the table instead of writing it")
    args = parser.parse_args()
    measured, kept = measure()
    table = json.loads(TABLE.read_text())["at_initialize_mb"] if TABLE.is_file() else {}
    off = {impl: 100 * (mb - table[impl]) / table[impl] for impl, mb in measured.items() if impl in table}
    for impl, mb in measured.items():
        added, predicted = kept[impl]
        print(f"{impl:<9} {mb:8.1f} MB resident beside the tensors once built"
              + (f" (table {table[impl]:.1f}, {off[impl]:+.1f} %)" if impl in table else "")
              + f"; the steps added {added:.1f} MB beside the live tensors, the heap predicted to keep {predicted:.1f}")
    if args.check:
        return 1 if set(off) != set(measured) or any(abs(value) > CHECK_PCT for value in off.values()) else 0
    TABLE.write_text(json.dumps({"at_initialize_mb": measured}, indent=1) + "\n")
    print(f"wrote {TABLE.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
