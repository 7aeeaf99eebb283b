"""PNG plots for a report: loss curves per impl, memory bars per (world size, stage), and memory
through one step (`phase_plot`).

matplotlib's Agg backend draws to files only, so this works on a headless CI machine.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (the backend must be chosen first)

from zero_lab.analysis.logparse import MEMORY_FIELDS  # noqa: E402
from zero_lab.analysis.markdown import METRIC_LABELS  # noqa: E402
from zero_lab.analysis.metrics import losses_of  # noqa: E402
from zero_lab.analysis.phase_plot import plot_step_phases  # noqa: E402


def run_label(summary: dict) -> str:
    return f"{summary['impl']} w{summary['world_size']} s{summary['stage']}"


def save(figure, axes, path: Path) -> Path:
    axes.legend(fontsize="small")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return path


def plot_losses(summaries: list[dict], path: Path) -> Path | None:
    """One line per run: loss by optimizer step."""
    curves = [(run_label(s), losses_of(s)) for s in summaries if s.get("losses")]
    if not curves:
        return None
    figure, axes = plt.subplots(figsize=(7, 4))
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
    figure, axes = plt.subplots(figsize=(max(6, 1.3 * len(measured)), 4))
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
    """Draw the plots beside the report; return their names relative to it."""
    stem = report_path.with_suffix("")
    drawn = [
        plot_losses(summaries, stem.with_name(f"{stem.name}-loss.png")),
        plot_memory(rows, stem.with_name(f"{stem.name}-memory.png")),
        plot_step_phases(summaries, stem.with_name(f"{stem.name}-phases.png")),
    ]
    return [path.name for path in drawn if path is not None]
