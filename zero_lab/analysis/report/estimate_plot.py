"""`zero-lab estimate --plot FILE`: the estimate's rows as grouped bars, one group per (world size,
stage), from the same figures the table prints (MB per rank):

    ZeRO paper          the paper's model states
    nano states         nano's model states at their most in the step (host part hatched)
    official estimator  official DeepSpeed's own estimator, where it has one (stages 2 and 3)
    fsdp2 states        FSDP2's model states after the backward (with --impls ...,fsdp2)
    predicted peak      nano's peak: model states, one micro-batch's activations, temporaries

Phase 1: `picture_numbers` keeps, per row, the figures present (None where a column is "-").
Phase 2: `draw` lays them out; `analysis.report.picture` saves the PNG with the numbers inside.
"""

from __future__ import annotations

from pathlib import Path

from zero_lab.analysis.report.picture import draw_picture

SERIES = {  # row key -> (label, colour)
    "paper_mb": ("ZeRO paper", "#BBBBBB"),
    "nano_mb": ("nano states", "#4C72B0"),
    "official_estimator_mb": ("official estimator", "#DD8452"),
    "fsdp2_mb": ("fsdp2 states", "#55A868"),
    "predicted_peak_mb": ("predicted peak (nano)", "#C44E52"),
}
HOST_KEYS = {"nano_mb": "nano_host_mb", "fsdp2_mb": "fsdp2_host_mb"}


def picture_numbers(title: str, rows: list[dict]) -> dict:
    """Phase 1: the MB of each series per row, rounded as the table prints them (0.1 MB)."""
    def rounded(value):
        return None if value is None else round(value, 1)

    return {"title": title,
            "rows": [{"world_size": row["world_size"], "stage": row["stage"],
                      **{key: rounded(row.get(key)) for key in SERIES},
                      **{host: rounded(row.get(host)) for host in HOST_KEYS.values()}} for row in rows]}


def draw(numbers: dict):
    """Phase 2: grouped bars with their values, a series left out where no row has it."""
    rows = numbers["rows"]
    shown = [key for key in SERIES if any(row[key] is not None or row.get(HOST_KEYS.get(key, "")) is not None
                                          for row in rows)]
    width = 0.8 / len(shown)

    def on(figure) -> None:
        axes = figure.add_axes((0.09, 0.24, 0.88, 0.64))
        tallest, labelled = 0.0, set()
        for index, key in enumerate(shown):
            label, colour = SERIES[key]
            for position, row in enumerate(rows):
                x = position - 0.4 + width * (index + 0.5)
                device, host = row[key] or 0.0, row.get(HOST_KEYS.get(key, "")) or 0.0
                if row[key] is None and not host:
                    continue
                axes.bar(x, device, width * 0.92, color=colour, label=None if key in labelled else label)
                if host:
                    axes.bar(x, host, width * 0.92, bottom=device, color=colour, hatch="////", edgecolor="white",
                             linewidth=0.3, label=None if key in labelled else f"{label} (host)")
                labelled.add(key)
                axes.text(x, device + host, f"{device + host:.1f}", ha="center", va="bottom", fontsize=6.5,
                          rotation=90 if len(rows) * len(shown) > 12 else 0)
                tallest = max(tallest, device + host)
        axes.set_xticks(range(len(rows)))
        axes.set_xticklabels([f"{row['world_size']} ranks, stage {row['stage']}" for row in rows])
        axes.set_ylim(0, tallest * 1.15 or 1)
        axes.set_ylabel("MB per rank")
        axes.spines[["top", "right"]].set_visible(False)
        axes.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.1), ncol=3, frameon=False)
        axes.set_title(numbers["title"], loc="left")
    return on


def plot_estimate(title: str, rows: list[dict], path: Path) -> Path:
    numbers = picture_numbers(title, rows)
    return draw_picture(path, max(8.5, 1.8 * len(rows) + 2.5), 4.6, draw(numbers), numbers)
