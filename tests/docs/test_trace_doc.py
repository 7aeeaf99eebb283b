"""docs/trace.md's "What to look for" against the report its command wrote (reports/trace-small.md):
each message size, call count and peak it states is read from that report's communication
summaries and tables here, and the pictures it shows are the report's own; "What it costs" against
the summaries bench/trace_overhead.py printed (reports/trace-overhead-<model>.json)."""

from __future__ import annotations

import json
import re

import pytest

from tests.docs.doc_text import REPO, read

DOC = read(REPO / "docs" / "trace.md")
REPORT = read(REPO / "reports" / "trace-small.md")


def stated(figure: str) -> None:
    assert re.search(rf"(?<![\d.,]){re.escape(figure)}(?![\d])", DOC), f"docs/trace.md does not state {figure}"


def comm_rows(stage: int, impl: str) -> list[tuple[str, int, int]]:
    """(op, message size, count) of rank 0's communication summary for one impl and stage."""
    section = REPORT.split(f"### Timeline: world size 2, stage {stage}", 1)[1]
    table = section.split(f"Communication, {impl} ", 1)[1].split("\n\n", 2)[1]
    rows = []
    for line in table.splitlines()[2:]:
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        rows.append((cells[0], int(cells[1]), int(cells[2])))
    return rows


def test_the_documented_command_wrote_the_report_and_its_pictures():
    assert "--report reports/trace-small.md" in DOC
    for picture in re.findall(r"\]\(\.\./reports/(trace-small-timeline-w2-s\d\.png)\)", DOC):
        assert f"]({picture})" in REPORT
        assert (REPO / "reports" / picture).is_file()


def test_stage_2_reduce_scatters_against_all_reduces():
    nano = [size for op, size, _ in comm_rows(2, "nano") if op == "reduce_scatter"]
    official = [size for op, size, _ in comm_rows(2, "official") if op == "all_reduce" and size > 8]
    assert len(nano) == 3 and len(official) == 2
    for size in nano + official:
        stated(f"{size:,}")
    wire = next(line for line in REPORT.split("## world size 2, stage 2", 1)[1].splitlines()
                if line.startswith("| wire MB / step"))
    stated(wire.strip("|").split("|")[-1].split()[-1])


def test_stage_3_gathers_reductions_and_peaks():
    nano = comm_rows(3, "nano")
    gathers = [(size, count) for op, size, count in nano if op.startswith("all_gather")]
    largest = max(size for size, _ in gathers)
    stated(f"{largest:,}")
    small = [(size, count) for size, count in gathers if size != largest]
    stated(f"{sum(count for _, count in small)} small")
    for size, count in small:
        stated(f"{count} of {size:,}")
    reductions = [(size, count) for op, size, count in nano if op.startswith("reduce_scatter")]
    stated(f"nano in {sum(count for _, count in reductions)} calls of up to {max(size for size, _ in reductions):,}")
    official = [size for op, size, _ in comm_rows(3, "official") if op.startswith("reduce_scatter")]
    assert len(official) == 2
    for size in official:
        stated(f"{size:,}")
    peak = next(line for line in REPORT.split("## world size 2, stage 3", 1)[1].splitlines()
                if line.startswith("| peak alloc MB"))
    nano_peak, official_peak = peak.strip("|").split("|")[1:3]
    stated(f"{nano_peak.strip()} MB for nano and {official_peak.strip()} MB for official")


@pytest.mark.parametrize("model", ["tiny", "small"])
def test_the_cost_table_is_the_benchs_own_summary(model):
    """Each row of "What it costs" is the last line bench/trace_overhead.py printed, kept in
    reports/trace-overhead-<model>.json: ratios with their intervals, files per run."""
    summary = json.loads((REPO / "reports" / f"trace-overhead-{model}.json").read_text())

    def ratio(name: str) -> str:
        return f"{summary[name]:.2f} ({summary[name + '_low']:.2f}-{summary[name + '_high']:.2f})"

    row = (f"| {model} | {summary['steps']} x {summary['pairs']} | {ratio('step_time_ratio')} | "
           f"{ratio('step_cpu_time_ratio')} | {summary['wall_ratio']:.2f}, {summary['cpu_ratio']:.2f} | "
           f"{summary['trace_mb_per_run']:.1f} MB |")
    assert row in DOC, row
    assert (summary["impl"], summary["stage"], summary["world_size"]) == ("nano", 3, 2)  # the doc's "nano at stage 3 on 2 ranks"
