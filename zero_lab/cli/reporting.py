"""Write a markdown report with its plots, and publish it to the GitHub Actions job summary."""

from __future__ import annotations

import os
from pathlib import Path

from zero_lab.analysis.report.markdown import render_report
from zero_lab.analysis.report.throughput_table import throughput_notes, throughput_table
from zero_lab.analysis.report.trace_report import timeline_section
from zero_lab.cli import output


def write_report(comparison: dict, summaries: list[dict], path: Path, title: str = "zero-lab: nano vs official DeepSpeed") -> str:
    """The report at path, PNGs beside it; appended to $GITHUB_STEP_SUMMARY when that is set."""
    from zero_lab.analysis.report.plots import write_plots  # matplotlib: only when a report is written

    path.parent.mkdir(parents=True, exist_ok=True)
    plots = write_plots(summaries, comparison["rows"], path)
    text = render_report(comparison, summaries, title, plots)
    timelines = timeline_section(summaries, path)  # --trace: a timeline per cell
    if timelines:
        text = text.rstrip("\n") + "\n\n" + timelines + "\n"
    path.write_text(text)
    step_summary = os.environ.get("GITHUB_STEP_SUMMARY")
    if step_summary:
        with open(step_summary, "a") as handle:
            handle.write(text + "\n")
    return text


def show_throughput(rows: list[dict]) -> None:
    """The console's throughput table (tokens/s, TFLOP/s, MFU) and its notes, for runs that logged steps."""
    headers, body = throughput_table(rows)
    if body:
        output.print_table(headers, body, title="throughput")
    for note in throughput_notes(rows):
        output.stdout.print(note, markup=False, highlight=False)
