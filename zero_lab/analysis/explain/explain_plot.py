"""`zero-lab explain --plot FILE`: one optimizer step of nano as a picture, from the walk-through's
own numbers (`analysis.explain.explain.Walkthrough`), in three panels:

    who holds what   each rank's share of the model's parameters, gradients, fp32 master and Adam
                     states: a coloured range of the whole (grey), the share a rank holds at its
                     fullest in the step (bytes held / bytes of the whole), hatched where it lives
                     on the host (offload)
    what one rank holds   the model-state MB at each moment, stacked by category, host hatched
    what one rank sends   the wire MB of each phase and of the step, by collective, the part sent to
                     other nodes hatched; a dashed line at data parallelism's all-reduce of every
                     gradient, 2(N-1)/N x bytes per gradient x P, the yardstick of the course

Phase 1 (numbers): `picture_numbers` reads them off the walk-through (bytes, as explain's JSON).
Phase 2 (drawing): `draw` lays them out; `analysis.report.picture` saves the PNG with the numbers inside.
"""

from __future__ import annotations

from pathlib import Path

from zero_lab.analysis.explain.explain import MOMENTS, Walkthrough
from zero_lab.analysis.report.picture import MB, OP_COLOURS, draw_picture
from zero_lab.nano.dtypes import BYTES_OF_PRECISION
from zero_lab.nano.memory.memory_formula import CATEGORIES

FP32_BYTES = 4
ADAM_BYTES = 8  # exp_avg and exp_avg_sq, fp32
MOST_RANKS_DRAWN = 8
COLOURS = {"parameters": "#4C72B0", "gathered_parameters": "#8EB1E0", "gradients": "#DD8452",
           "fp32_master_partition": "#55A868", "optimizer_states": "#C44E52", "gradient_partition": "#937860",
           "communication_buckets": "#DA8BC3"}
EXPLAINED_OPS = ("all_reduce", "reduce_scatter", "all_gather", "all_to_all")  # what a ZeRO step moves, in order
MOMENT_LABELS = {"between_steps": "between\nsteps", "end_of_forward": "end of\nforward",
                 "end_of_backward": "end of\nbackward", "optimizer_step": "optimizer\nstep"}


def held(walk: Walkthrough, category: str) -> tuple[int, bool]:
    """(the most bytes of a category one rank holds at any moment, whether any of it is on the host)."""
    most = max(sum(walk.moments[moment][place][category] for place in ("device", "host")) for moment in MOMENTS)
    on_host = any(walk.moments[moment]["host"][category] for moment in MOMENTS)
    return most, on_host


def shares(walk: Walkthrough) -> dict[str, dict]:
    """Each lane of "who holds what": the fraction of the whole one rank holds at its fullest, its
    place, and the category that holds it (full-size gradients at stages 0-1, the fp32 gradient
    partition from stage 2; stage 0's step holds a whole fp32 gradient, fraction 1); the parameters
    are "gathered" when the forward all-gathers them for use."""
    numel, width = walk.parameters, BYTES_OF_PRECISION[walk.precision]
    lanes = {}
    parameters, on_host = held(walk, "parameters")
    gathered = any(item.phase == "forward" and item.op == "all_gather" for item in walk.collectives)
    lanes["parameters"] = {"fraction": parameters / (width * numel), "host": on_host, "category": "parameters",
                           "gathered": gathered}
    full, full_on_host = held(walk, "gradients")
    partition, partition_on_host = held(walk, "gradient_partition")
    if full / (width * numel) >= partition / (FP32_BYTES * numel):
        lanes["gradients"] = {"fraction": full / (width * numel), "host": full_on_host, "category": "gradients"}
    else:
        lanes["gradients"] = {"fraction": partition / (FP32_BYTES * numel), "host": partition_on_host,
                              "category": "gradient_partition"}
    master, on_host = held(walk, "fp32_master_partition")
    lanes["fp32 master"] = {"fraction": master / (FP32_BYTES * numel), "host": on_host,
                            "category": "fp32_master_partition"}
    states, on_host = held(walk, "optimizer_states")
    lanes["Adam states"] = {"fraction": states / (ADAM_BYTES * numel), "host": on_host, "category": "optimizer_states"}
    return {name: {**lane, "fraction": round(min(lane["fraction"], 1.0), 6)} for name, lane in lanes.items()}


def picture_numbers(walk: Walkthrough) -> dict:
    """Phase 1: every number the picture draws, in bytes (plain JSON)."""
    payload = walk.to_json()
    moves: dict[str, dict[str, list[int]]] = {phase["name"]: {} for phase in payload["phases"]}
    for item in payload["collectives"]:
        intra_inter = moves[item["phase"]].setdefault(item["op"], [0, 0])
        intra = item["wire_intra_bytes"] if walk.ranks_per_node else item["wire_bytes"]
        intra_inter[0] += intra
        intra_inter[1] += item["wire_bytes"] - intra
    width = BYTES_OF_PRECISION[walk.precision]
    world = walk.world_size
    return {
        "title": title(walk),
        "world_size": world,
        "shares": shares(walk),
        "holds": {moment: {category: [walk.moments[moment]["device"][category], walk.moments[moment]["host"][category]]
                           for category in CATEGORIES} for moment in MOMENTS},
        "moves": moves,
        "data_parallel_wire_bytes": 2 * (world - 1) * width * walk.parameters // world,
    }


def title(walk: Walkthrough) -> str:
    offload = {(True, True): ", parameters and optimizer on the host", (False, True): ", optimizer on the host"}
    host = {category for moment in MOMENTS for category, nbytes in walk.moments[moment]["host"].items() if nbytes}
    nodes = f", nodes of {walk.ranks_per_node}" if walk.ranks_per_node else ""
    return (f"{walk.model}: ZeRO stage {walk.stage}, {walk.world_size} rank{'s' if walk.world_size > 1 else ''}, "
            f"{walk.precision}{nodes}{offload.get(('parameters' in host, 'optimizer_states' in host), '')}: "
            "one optimizer step (zero-lab explain)")


def draw_shares(axes, numbers: dict) -> None:
    world = numbers["world_size"]
    drawn = min(world, MOST_RANKS_DRAWN)
    lanes = list(numbers["shares"].items())
    ticks, labels, row = [], [], 0.0
    for rank in range(drawn):
        top = row
        for name, lane in lanes:
            axes.barh(row, 1.0, 0.8, color="#E6E6E6", edgecolor="#BBBBBB", linewidth=0.5)
            fraction = lane["fraction"]
            if fraction > 0:
                start = 0.0 if fraction >= 0.999 else min(rank * fraction, 1.0 - fraction)
                axes.barh(row, fraction if fraction < 0.999 else 1.0, 0.8, left=start,
                          color=COLOURS[lane["category"]], hatch="////" if lane["host"] else None,
                          edgecolor="white" if lane["host"] else COLOURS[lane["category"]], linewidth=0.3)
            note = f"{name}: " + ("none" if fraction == 0 else "all" if fraction >= 0.999 else f"1/{round(1 / fraction)}")
            if lane.get("gathered"):
                note += ", whole for use"
            axes.text(1.02, row, note, va="center", fontsize=7)
            row += 1.0
        ticks.append((top + row - 1.0) / 2)
        labels.append(f"rank {rank}")
        row += 0.7
    axes.set_yticks(ticks)
    axes.set_yticklabels(labels)
    axes.set_ylim(row - 0.5, -0.7)
    axes.set_xlim(0, 1.5)
    axes.set_xticks([0, 0.5, 1.0])
    axes.set_xticklabels(["0", "P/2", "P"])
    axes.spines[["top", "right"]].set_visible(False)
    more = f" (ranks 0-{drawn - 1} of {world})" if drawn < world else ""
    axes.set_title(f"Who holds what: each rank's share of the P parameters{more}", loc="left")


def draw_holdings(axes, numbers: dict) -> None:
    positions = range(len(MOMENTS))
    bottoms = [0.0] * len(MOMENTS)
    for category in CATEGORIES:
        for place_index, hatch in ((0, None), (1, "////")):
            heights = [numbers["holds"][moment][category][place_index] / MB for moment in MOMENTS]
            if not any(heights):
                continue
            label = category.replace("_", " ") + (" (host)" if place_index else "")
            axes.bar(positions, heights, 0.6, bottom=bottoms, color=COLOURS[category], hatch=hatch,
                     edgecolor="white", linewidth=0.3, label=label)
            bottoms = [low + height for low, height in zip(bottoms, heights)]
    for position, total in zip(positions, bottoms):
        axes.text(position, total, f"{total:.2f}", ha="center", va="bottom", fontsize=7)
    axes.set_xticks(list(positions))
    axes.set_xticklabels([MOMENT_LABELS[moment] for moment in MOMENTS])
    axes.set_ylim(0, max(bottoms) * 1.12 or 1)
    axes.set_ylabel("MB")
    axes.spines[["top", "right"]].set_visible(False)
    axes.set_title("What one rank holds, model states (MB)", loc="left")
    legend_below(axes)


def draw_moves(axes, numbers: dict) -> None:
    phases = [*numbers["moves"], "step"]
    ops = [op for op in EXPLAINED_OPS if any(op in moved for moved in numbers["moves"].values())]
    per_phase = {phase: {op: numbers["moves"][phase].get(op, [0, 0]) for op in ops} for phase in numbers["moves"]}
    per_phase["step"] = {op: [sum(per_phase[phase][op][part] for phase in numbers["moves"]) for part in (0, 1)]
                         for op in ops}
    bottoms = [0.0] * len(phases)
    for op in ops:
        for part, hatch in ((0, None), (1, "xxxx")):
            heights = [per_phase[phase][op][part] / MB for phase in phases]
            if not any(heights):
                continue
            label = op.replace("_", "-") + (" (to other nodes)" if part else "")
            axes.bar(range(len(phases)), heights, 0.6, bottom=bottoms, color=OP_COLOURS[op], hatch=hatch,
                     edgecolor="white", linewidth=0.3, label=label)
            bottoms = [low + height for low, height in zip(bottoms, heights)]
    for position, total in enumerate(bottoms):
        axes.text(position, total, f"{total:.2f}", ha="center", va="bottom", fontsize=7)
    reference = numbers["data_parallel_wire_bytes"] / MB
    if reference:
        axes.axhline(reference, color="black", linestyle="--", linewidth=0.8,
                     label=f"data parallel all-reduce: {reference:.2f}")
    axes.set_xticks(range(len(phases)))
    axes.set_xticklabels([phase.replace("_", "\n") for phase in phases], fontsize=7)
    axes.set_ylim(0, max([*bottoms, reference]) * 1.12 or 1)
    axes.set_ylabel("wire MB")
    axes.spines[["top", "right"]].set_visible(False)
    axes.set_title("What one rank sends, per phase and per step (wire MB)", loc="left")
    legend_below(axes)


def legend_below(axes) -> None:
    axes.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.17), ncol=2, frameon=False)


def draw(numbers: dict):
    """Phase 2: the three panels, as a function of a Figure."""
    def on(figure) -> None:
        grid = figure.add_gridspec(1, 3, width_ratios=[1.25, 1, 1], left=0.05, right=0.99, bottom=0.3, top=0.88,
                                   wspace=0.28)
        draw_shares(figure.add_subplot(grid[0]), numbers)
        draw_holdings(figure.add_subplot(grid[1]), numbers)
        draw_moves(figure.add_subplot(grid[2]), numbers)
        figure.suptitle(numbers["title"], x=0.05, ha="left", fontsize=10)
    return on


def plot_walkthrough(walk: Walkthrough, path: Path) -> Path:
    numbers = picture_numbers(walk)
    return draw_picture(path, 15, 5.6, draw(numbers), numbers)
