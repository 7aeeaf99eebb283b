"""`zero-lab timeline RUN... --plot FILE`: each run's wire bytes of one traced step, split by when they
were issued (`analysis.runs.speed.overlap`'s moments).

    forward         issued while the forward computes (stage 3's gathers and prefetch)
    autograd        issued while autograd computes the gradients (buckets reduced from hooks)
    after autograd  issued in the backward after autograd returned: nothing left to overlap
    step            issued in the optimizer step

Phase 1: `picture_numbers` keeps, per run, the MB of each moment (order and bytes only: the same
         on every machine, so the picture can be drawn again).
Phase 2: `draw` lays the runs out as horizontal stacked bars; `analysis.report.picture` saves the
         PNG with the numbers inside.
"""

from __future__ import annotations

from pathlib import Path

from zero_lab.analysis.report.picture import MB, draw_picture
from zero_lab.analysis.runs.speed.overlap import MOMENTS

COLOURS = {"forward": "#4C72B0", "autograd": "#55A868", "after autograd": "#C44E52", "step": "#8C8C8C"}


def picture_numbers(title: str, runs: list[dict]) -> dict:
    """Phase 1: runs as `zero-lab timeline --format json` gives them."""
    return {"title": title,
            "runs": [{"run": run["run"],
                      "mb": {moment: round(run["moments"][moment]["wire_bytes"] / MB, 3) for moment in MOMENTS}}
                     for run in runs]}


def draw(numbers: dict):
    """Phase 2: one bar per run, top to bottom in the order given."""
    runs = numbers["runs"]

    def on(figure) -> None:
        from matplotlib.patches import Patch

        axes = figure.add_axes((0.2, 0.22, 0.76, 0.66))
        for row, run in enumerate(runs):
            y, left = len(runs) - 1 - row, 0.0
            for moment in MOMENTS:
                width = run["mb"][moment]
                if width > 0:
                    axes.barh(y, width, 0.6, left=left, color=COLOURS[moment], edgecolor="white")
                    left += width
            axes.text(left, y, f" {left:.2f}", va="center", fontsize=7)
        axes.set_yticks(range(len(runs)))
        axes.set_yticklabels([run["run"] for run in reversed(runs)])
        axes.set_xlabel("wire MB of one step, by when each collective was issued")
        axes.set_title(numbers["title"])
        axes.set_xlim(0, max(sum(run["mb"].values()) for run in runs) * 1.15 or 1)
        for side in ("top", "right"):
            axes.spines[side].set_visible(False)
        handles = [Patch(color=COLOURS[moment], label=moment) for moment in MOMENTS]
        axes.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.45, -0.14), ncol=len(handles),
                    frameon=False)
    return on


def plot_overlap(title: str, runs: list[dict], path: Path) -> Path:
    numbers = picture_numbers(title, runs)
    return draw_picture(path, 8.0, 1.2 + 0.45 * len(runs), draw(numbers), numbers)
