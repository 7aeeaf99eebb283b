"""Benchmark: what a CPU rank holds resident beside its tensors, per impl, measured on a tiny run and
kept in zero_lab/analysis/memory/resident_base.json for the preflight (`analysis.memory.resident`).

    .venv/bin/python bench/resident_base.py            # measure, print, and write the table
    .venv/bin/python bench/resident_base.py --check    # measure and print against the table; exit 1 if >25% off

Phase 1: one `zero-lab compare` on the tiny model, 2 CPU ranks, 3 steps: nano and official at stage 0
         (no buffer allocated and left untouched), FSDP2 at stage 2 (its first).
Phase 2: per impl, the resident high-water mark of a rank (`peak_reserved_max_mb`, VmHWM) less the
         peak of its live tensors (`peak_alloc_max_mb`): the interpreter, torch and its libraries, the
         engine, and the threads' and allocator's own memory (`beside_tensors_mb`, what the preflight
         adds before launch); and of it, what the steps added beside the tensors after the engine was
         built (less the `[model]` line's `rss_beside_tensors_mb`: `growth_in_steps_mb`, what a run's
         summary adds to the reading it took on its own machine).
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


def measure() -> dict[str, dict[str, float]]:
    """Phases 1-2."""
    base, growth = {}, {}
    for impl, stage in STAGE_OF_IMPL.items():
        (row,) = run_compare("--gpus", "2", "--device", "cpu", "--model", "tiny", "--steps", "3", "--stages",
                             str(stage), "--impls", impl, "--name", f"resident-{impl}")["rows"]
        if row["status"] != "ok":
            sys.exit(f"error: the {impl} run ended {row['status']}: {row.get('error')}")
        base[impl] = round(row["peak_reserved_max_mb"] - row["peak_alloc_max_mb"], 1)
        growth[impl] = round(base[impl] - row["rss_beside_tensors_mb"], 1)
    return {"beside_tensors_mb": base, "growth_in_steps_mb": growth}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare with the table instead of writing it")
    args = parser.parse_args()
    table = measure()
    measured, growth = table["beside_tensors_mb"], table["growth_in_steps_mb"]
    kept = json.loads(TABLE.read_text())["beside_tensors_mb"] if TABLE.is_file() else {}
    off = {impl: 100 * (mb - kept[impl]) / kept[impl] for impl, mb in measured.items() if impl in kept}
    for impl, mb in measured.items():
        print(f"{impl:<9} {mb:8.1f} MB resident beside the tensors, {growth[impl]:6.1f} MB of it added by the steps"
              + (f" (table {kept[impl]:.1f}, {off[impl]:+.1f} %)" if impl in kept else ""))
    if args.check:
        return 1 if set(off) != set(measured) or any(abs(value) > CHECK_PCT for value in off.values()) else 0
    TABLE.write_text(json.dumps(table, indent=1) + "\n")
    print(f"wrote {TABLE.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
