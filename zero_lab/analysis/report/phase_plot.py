"""The report's memory-through-a-step figure: per (world size, stage), nano's bytes after forward,
after backward and after the optimizer step, stacked by category, with every other impl's live
bytes as a line over the same phases (the ZeRO paper's Figure 1, measured on rank 0).

The numbers come from `step_phases` (tested there); this module only draws them.
"""

from __future__ import annotations

from pathlib import Path

from zero_lab.analysis.runs.speed.step_phases import has_categories, stacked_categories
from zero_lab.workload.log_contract.log_lines import MB
from zero_lab.workload.meters.phase_memory import PHASES


def cells_with_phases(summaries: list[dict]) -> dict[tuple[int, int], list[dict]]:
    """(world size, stage) -> the summaries of that cell that carry the last step's phases."""
    cells: dict[tuple[int, int], list[dict]] = {}
    for summary in summaries:
        if summary.get("phases"):
            cells.setdefault((summary["world_size"], summary["stage"]), []).append(summary)
    return dict(sorted(cells.items()))


def plot_step_phases(summaries: list[dict], path: Path) -> Path | None:
    """One panel per cell: nano stacked by category, the other impls as lines; None without samples."""
    cells = cells_with_phases(summaries)
    if not cells:
        return None
    from matplotlib.figure import Figure  # without pyplot, as analysis.report.plots draws

    figure = Figure(figsize=(4.2 * len(cells), 4))
    panels = figure.subplots(1, len(cells), squeeze=False)
    positions = range(len(PHASES))
    for axes, ((world_size, stage), cell) in zip(panels[0], cells.items()):
        for summary in cell:
            phases = summary["phases"]
            if has_categories(phases):
                bottom = [0.0] * len(phases)
                for label, values in stacked_categories(phases).items():
                    heights = [value / MB for value in values]
                    axes.bar(positions, heights, 0.6, bottom=bottom, label=f"{summary['impl']}: {label}")
                    bottom = [low + height for low, height in zip(bottom, heights)]
            else:
                axes.plot(positions, [row["live_bytes"] / MB for row in phases], marker="o", color="black",
                          label=f"{summary['impl']}: live")
        axes.set_xticks(list(positions))
        axes.set_xticklabels([phase.replace("_", " ") for phase in PHASES], fontsize="small")
        axes.set_title(f"world size {world_size}, stage {stage}")
        axes.set_ylabel("MB on rank 0")
    legend = {}  # one entry per label, whichever panel drew it first
    for axes in panels[0]:
        for handle, label in zip(*axes.get_legend_handles_labels()):
            legend.setdefault(label, handle)
    figure.legend(list(legend.values()), list(legend), loc="lower center", ncol=min(len(legend), 7), fontsize="small")
    figure.suptitle("Memory through one step (last step)")
    figure.subplots_adjust(left=0.6 / (4.2 * len(cells)), right=1 - 0.15 / (4.2 * len(cells)), bottom=0.25,
                           top=0.85, wspace=0.3)
    figure.savefig(path, dpi=100)
    return path
