"""PNG plots for a report: loss curves per impl, memory bars per (world size, stage), and memory
through one step (`phase_plot`).

Figures are drawn as `matplotlib.figure.Figure` objects, without pyplot: no GUI backend, no global
figure registry, nothing to close, and a start-up that skips pyplot's import; `savefig` renders
PNGs with Agg, so this works on a headless CI machine. Margins are set, not measured
(`tight_layout` would draw each figure once more to measure its text): the report's start-up
is mostly drawing.
"""

from __future__ import annotations

from pathlib import Path

from matplotlib.figure import Figure

from zero_lab.analysis.runs.logparse import MEMORY_FIELDS
from zero_lab.analysis.report.markdown import METRIC_LABELS, first_runs
from zero_lab.analysis.report.phase_plot import plot_step_phases
from zero_lab.analysis.runs.rundir import losses_of


def run_label(summary: dict) -> str:
    return f"{summary['impl']} w{summary['world_size']} s{summary['stage']}"


def save(figure: Figure, axes, path: Path) -> Path:
    axes.legend(fontsize="small")
    figure.savefig(path, dpi=100)
    return path


def plot_losses(summaries: list[dict], path: Path) -> Path | None:
    """One line per run: loss by optimizer step."""
    curves = [(run_label(s), losses_of(s)) for s in summaries if s.get("losses")]
    if not curves:
        return None
    figure = Figure(figsize=(7, 4))
    figure.subplots_adjust(left=0.1, right=0.97, bottom=0.13, top=0.91)
    axes = figure.subplots()
    # Matching impls draw on top of each other: alternate solid and dashed so both stay visible.
    for index, (label, losses) in enumerate(curves):
        steps = sorted(losses)
        axes.plot(steps, [losses[step] for step in steps], marker=".", label=label,
                  linestyle="-" if index % 2 == 0 else "--")
    axes.xaxis.get_major_locator().set_params(integer=True)
    axes.set_xlabel("optimizer step")
    axes.set_ylabel("loss")
    axes.set_title("Loss")
    return save(figure, axes, path)


def plot_memory(rows: list[dict], path: Path) -> Path | None:
    """Grouped bars: for every run, its four memory maxima in MB."""
    measured = [row for row in rows if row.get("alloc_max_mb") is not None]
    if not measured:
        return None
    width_inches = max(6, 1.3 * len(measured))
    figure = Figure(figsize=(width_inches, 4))
    figure.subplots_adjust(left=0.7 / width_inches, right=1 - 0.2 / width_inches, bottom=0.2, top=0.91)
    axes = figure.subplots()
    width = 0.8 / len(MEMORY_FIELDS)
    for index, name in enumerate(MEMORY_FIELDS):
        positions = [run + index * width for run in range(len(measured))]
        axes.bar(positions, [row.get(name) or 0 for row in measured], width, label=METRIC_LABELS[name])
    axes.set_xticks([run + 0.4 - width / 2 for run in range(len(measured))])
    axes.set_xticklabels([run_label(row) for row in measured], rotation=20, fontsize="small")
    axes.set_ylabel("MB (max over ranks)")
    axes.set_title("Memory per world size, stage and impl")
    return save(figure, axes, path)


def write_plots(summaries: list[dict], rows: list[dict], report_path: Path) -> list[str]:
    """Draw the plots beside the report, each impl's first run of a cell; return their names
    relative to the report."""
    summaries, rows = first_runs(summaries), first_runs(rows)
    stem = report_path.with_suffix("")
    drawn = [
        plot_losses(summaries, stem.with_name(f"{stem.name}-loss.png")),
        plot_memory(rows, stem.with_name(f"{stem.name}-memory.png")),
        plot_step_phases(summaries, stem.with_name(f"{stem.name}-phases.png")),
    ]
    return [path.name for path in drawn if path is not None]
