"""Benchmark: what a CPU rank holds resident beside its tensors, per impl, measured on a tiny run and
kept in zero_lab/analysis/memory/resident_base.json for the preflight (`analysis.memory.resident`).

    .venv/bin/python bench/resident_base.py            # measure, print, and write the table
    .venv/bin/python bench/resident_base.py --check    # measure and print against the table; exit 1 if >25% off

Phase 1: one `zero-lab compare` on the tiny model, 2 CPU ranks, 3 steps: nano and official at stage 0
         (no buffer allocated and left untouched), FSDP2 at stage 2 (its first).
Phase 2: per impl, the resident high-water mark of a rank (`peak_reserved_max_mb`, VmHWM) less the
         peak of its live tensors (`peak_alloc_max_mb`): the interpreter, torch and its libraries, the
         engine, and the threads' and allocator's own memory.
Phase 3: write the table, or with --check compare against it.
"""

from __future__ import annotations

import argparse
import json
import sys

from compare_json import REPO, run_compare  # bench/compare_json.py

TABLE = REPO / "zero_lab" / "analysis" / "memory" / "resident_base.json"
CHECK_PCT = 25.0
STAGE_OF_IMPL = {"nano": 0, "official": 0, "fsdp2": 2}


def measure() -> dict[str, float]:
    """Phases 1-2."""
    base = {}
    for impl, stage in STAGE_OF_IMPL.items():
        (row,) = run_compare("--gpus", "2", "--device", "cpu", "--model", "tiny", "--steps", "3", "--stages",
                             str(stage), "--impls", impl, "--name", f"resident-{impl}")["rows"]
        if row["status"] != "ok":
            sys.exit(f"error: the {impl} run ended {row['status']}: {row.get('error')}")
        base[impl] = round(row["peak_reserved_max_mb"] - row["peak_alloc_max_mb"], 1)
    return base


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare with the table instead of writing it")
    args = parser.parse_args()
    measured = measure()
    kept = json.loads(TABLE.read_text()) if TABLE.is_file() else {}
    off = {impl: 100 * (mb - kept[impl]) / kept[impl] for impl, mb in measured.items() if impl in kept}
    for impl, mb in measured.items():
        print(f"{impl:<9} {mb:8.1f} MB resident beside the tensors" + (f" (table {kept[impl]:.1f}, {off[impl]:+.1f} %)"
                                                                     if impl in kept else ""))
    if args.check:
        return 1 if set(off) != set(measured) or any(abs(value) > CHECK_PCT for value in off.values()) else 0
    TABLE.write_text(json.dumps(measured, indent=1) + "\n")
    print(f"wrote {TABLE.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
