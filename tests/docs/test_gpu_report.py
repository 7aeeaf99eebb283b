"""docs/gpu.md's "What the first GPU run measured" against the tables that run wrote
(reports/gpu-check.md, reports/gpu-check-offload.md): every figure the section states is read
or worked out from them here, so a new run's tables and the section cannot drift apart."""

from __future__ import annotations

import re

import pytest

from tests.docs.doc_text import REPO, read

SECTION = read(REPO / "docs" / "gpu.md").split("## What the first GPU run measured", 1)[1]


def runs(report: str) -> dict[tuple[int, str], dict[str, str]]:
    """The report's `## Runs` table, keyed by (stage, impl)."""
    lines = read(REPO / "reports" / report).split("## Runs", 1)[1].strip().splitlines()
    header = [cell.strip() for cell in lines[0].strip("|").split("|")]
    rows = {}
    for line in lines[2:]:
        if not line.startswith("|"):
            break
        row = dict(zip(header, (cell.strip() for cell in line.strip("|").split("|"))))
        rows[int(row["stage"]), row["impl"]] = row
    return rows


def table_row(report: str, stage: int, metric: str) -> list[str]:
    """A metric's cells in the comparison table of one stage."""
    section = read(REPO / "reports" / report).split(f"world size 1, stage {stage}:", 1)[1]
    line = next(line for line in section.splitlines() if line.startswith(f"| {metric} |"))
    return [cell.strip() for cell in line.strip("|").split("|")][1:]


def stated(figure: str) -> None:
    assert re.search(rf"(?<![\d.]){re.escape(figure)}(?![\d])", SECTION), f"docs/gpu.md does not state {figure}"


def test_memory_figures_are_the_runs():
    three_way = runs("gpu-check.md")
    for stage in (2, 3):
        for impl in ("nano", "official"):
            for column in ("alloc MB", "peak alloc MB"):
                stated(three_way[stage, impl][column])
    nano, official = three_way[2, "nano"], three_way[2, "official"]
    stated(f"{float(nano['peak alloc MB']) - float(official['peak alloc MB']):.1f} MB more")
    stated(f"{float(nano['alloc MB']) - float(three_way[2, 'fsdp2']['alloc MB']):.1f} MB less than nano")
    stated(three_way[2, "fsdp2"]["alloc MB"])
    stated(official["comm MB / step"])
    for metric in ("alloc MB", "peak alloc MB"):
        stated(table_row("gpu-check.md", 3, metric)[3].lstrip("-") + "% less")


@pytest.mark.parametrize("stage", [2, 3])
def test_loss_gaps_are_the_runs(stage):
    stated(table_row("gpu-check.md", stage, "max step loss delta nano vs official")[-1].split()[0])
    assert table_row("gpu-check-offload.md", stage, "max step loss delta")[2] == "0.00000000"


def test_offload_and_speed_figures_are_the_runs():
    offload = runs("gpu-check-offload.md")
    stated(offload[3, "nano"]["peak alloc MB"])
    stated(offload[3, "official"]["peak alloc MB"])
    stated(table_row("gpu-check-offload.md", 3, "peak alloc MB")[3].lstrip("+") + "% more")
    for stage in (2, 3):
        stated(table_row("gpu-check-offload.md", stage, "step ms, median (IQR)")[3].split()[1])
        nano_ratio, fsdp2_ratio = (cell.split()[1] for cell in table_row("gpu-check.md", stage, "step ms, median (IQR)")[3:5])
        stated(nano_ratio)
        stated(fsdp2_ratio)
    predicted, _ = estimate("gpu-check-offload.md", 3, "official")
    stated(f"({predicted} MB)")  # the report's prediction; tests/analysis/test_official_step_memory.py holds today's


def estimate(report: str, stage: int, impl: str) -> tuple[str, str]:
    """(predicted peak MB, peak error %) of a run in the report's estimates table."""
    estimates = read(REPO / "reports" / report).split("## Measured memory", 1)[1]
    line = next(line for line in estimates.splitlines() if line.startswith(f"| 1 | {stage} | {impl} |"))
    predicted, error = line.strip("|").split("|")[-2:]
    return predicted.strip(), error.strip().lstrip("+-")


def test_predicted_peaks_are_the_runs():
    predicted, error = estimate("gpu-check.md", 2, "nano")
    stated(predicted)
    stated(f"{error}%")
    stated(f"within {estimate('gpu-check.md', 3, 'nano')[1]}%")
    predicted, error = estimate("gpu-check-offload.md", 3, "nano")
    stated(f"{predicted} MB, within {error}%")
