"""The timeline picture of one cell: the impls side by side, one traced step each, from the trace files.

Each impl gets a column of two panels, on one time axis (ms from the step's start on its first rank):
    spans   a band per rank: above, the engine calls (forward, backward, optimizer step) as the
            compute the rank did; below, its collectives, coloured by kind. A collective that runs
            beside the compute band's span is overlap; one that runs while the band waits is not.
    memory  each rank's allocated MB through the step (the trace's memory counter).
The step drawn is the last one traced (the first may carry one-time work: optimizer states, a
stage-3 trace being recorded). The columns share their time axis, so a longer step is wider.

Phase 1 (numbers): `cell_timeline` cuts each rank's spans and memory to the step, in ms and MB.
Phase 2 (drawing): `draw_timeline` lays them out; `analysis.report.picture` saves the PNG with the numbers.
"""

from __future__ import annotations

from pathlib import Path

from zero_lab.analysis.runs import traces
from zero_lab.analysis.report.picture import MB, OP_COLOURS, draw_picture

PHASE_COLOURS = {"forward": "#4C72B0", "backward": "#55A868", "optimizer step": "#C44E52"}
MEMORY_POINTS = 300  # per rank: the picture's line, and the numbers the PNG carries


def rank_timeline(trace: dict, step: int, origin: float) -> dict:
    """Phase 1 for one rank: its engine calls, collectives and memory inside `step`, times in ms from `origin`."""
    start, end = traces.step_windows(trace)[step]

    def inside(span: dict) -> bool:
        return span["args"].get("step") == step

    def cut(span: dict) -> list:
        return [round((span["ts"] - origin) / 1e3, 3), round(span["dur"] / 1e3, 3)]

    return {"rank": trace["distributedInfo"]["rank"],
            "phases": [[span["name"], *cut(span)] for span in traces.spans(trace, "phase") if inside(span)],
            "collectives": [[traces.family(span["name"]), *cut(span)] for span in traces.spans(trace, "collective")
                            if inside(span)],
            "memory": [[round((time - origin) / 1e3, 3), round(value / MB, 3)]
                       for time, value in thinned([point for point in traces.memory_series(trace)
                                                   if start <= point[0] <= end])]}


def thinned(points: list[tuple[float, int]], most: int = MEMORY_POINTS) -> list[tuple[float, int]]:
    """At most about `most` points: of each run of consecutive points, the highest (peaks survive)."""
    stride = -(-len(points) // most) if points else 1
    return [max(points[index:index + stride], key=lambda point: point[1]) for index in range(0, len(points), stride)]


def cell_timeline(runs: list[tuple[str, list[dict]]]) -> dict:
    """Phase 1: {impl: {"step": k, "ranks": [...]}} for the impls of one cell that were traced."""
    drawn = {}
    for impl, rank_traces in runs:
        common = set.intersection(*(set(traces.step_windows(trace)) for trace in rank_traces)) if rank_traces else set()
        if not common:
            continue
        step = max(common)
        origin = min(traces.step_windows(trace)[step][0] for trace in rank_traces)
        drawn[impl] = {"step": step, "ranks": [rank_timeline(trace, step, origin) for trace in rank_traces]}
    return drawn


def draw_timeline(figure, data: dict, title: str) -> None:
    """Phase 2."""
    impls = list(data)
    axes = figure.subplots(2, len(impls), squeeze=False, sharex=True, gridspec_kw={"height_ratios": [3, 2]})
    longest = max(max((start + length for rank in cell["ranks"] for _, start, length in rank["phases"]), default=1)
                  for cell in data.values())
    top = max((value for cell in data.values() for rank in cell["ranks"] for _, value in rank["memory"]), default=1)
    for column, impl in enumerate(impls):
        cell = data[impl]
        spans_axes, memory_axes = axes[0][column], axes[1][column]
        for rank in cell["ranks"]:
            row = rank["rank"]
            for name, start, length in rank["phases"]:
                spans_axes.broken_barh([(start, length)], (row + 0.05, 0.4), color=PHASE_COLOURS.get(name, "#999999"))
            for op, start, length in rank["collectives"]:
                spans_axes.broken_barh([(start, max(length, longest / 2000))], (row + 0.5, 0.4),
                                       color=OP_COLOURS.get(op, "#333333"), alpha=0.8)
            times = [time for time, _ in rank["memory"]]
            memory_axes.step(times, [value for _, value in rank["memory"]], where="post", label=f"rank {row}",
                             linewidth=0.9)
        ranks = len(cell["ranks"])
        spans_axes.set_yticks([row + 0.5 for row in range(ranks)], [f"rank {row}" for row in range(ranks)])
        spans_axes.set_ylim(ranks, 0)
        spans_axes.set_title(f"{impl}: step {cell['step']}")
        memory_axes.set_ylim(0, top * 1.05)
        memory_axes.set_xlabel("ms from the step's start")
        if column == 0:
            memory_axes.set_ylabel("allocated MB")
        memory_axes.legend(fontsize="small", loc="lower right")
    axes[0][0].set_xlim(0, longest * 1.02)
    used_ops = sorted({op for cell in data.values() for rank in cell["ranks"] for op, _, _ in rank["collectives"]})
    handles = [_patch(colour, name) for name, colour in PHASE_COLOURS.items()]
    handles += [_patch(OP_COLOURS.get(op, "#333333"), op) for op in used_ops]
    figure.legend(handles=handles, loc="upper center", ncol=min(len(handles), 7), fontsize="small", frameon=False,
                  bbox_to_anchor=(0.5, 0.995))
    figure.suptitle(title + "  (upper half of a band: compute; lower half: collectives)", y=0.92, fontsize=9)
    figure.subplots_adjust(left=0.07, right=0.99, top=0.84, bottom=0.1, hspace=0.15, wspace=0.12)


def _patch(colour: str, label: str):
    from matplotlib.patches import Patch

    return Patch(color=colour, label=label)


def write_timeline(runs: list[tuple[str, list[dict]]], path: Path, title: str) -> Path | None:
    """The cell's picture at `path` (None: none of its runs was traced)."""
    data = cell_timeline(runs)
    if not data:
        return None
    return draw_picture(path, 4.2 * len(data) + 1, 4.6, lambda figure: draw_timeline(figure, data, title), data)
