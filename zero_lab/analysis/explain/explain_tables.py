"""The tables of `zero-lab explain`: a walk-through (and, with --measure, a measurement beside its
prediction) as (headers, rows) that the terminal and the markdown writer both print.

    holdings_table     what one rank holds at each moment, by category (MB)
    phases_table       the step phase by phase: the engine call, what a rank holds after it, what moves
    collectives_table  the collectives in order, a run of equal ones on one row, and rows that repeat
                       layer after layer once, "x 28 layers" (the JSON keeps every call)
    peak_line          the peak of model states and ZeRO++'s temporaries, and where it is
"""

from __future__ import annotations

import re
from collections import Counter
from itertools import groupby

from zero_lab.analysis.explain.explain import MOMENTS, PHASES, Walkthrough
from zero_lab.analysis.report.markdown import fmt, markdown_table
from zero_lab.nano.memory.memory_formula import CATEGORIES

MIB = 2**20


def mb(nbytes: int) -> str:
    return fmt(nbytes / MIB, 2)


def holdings_table(walk: Walkthrough) -> tuple[list[str], list[list[str]]]:
    figures = {moment: walk.moment_bytes(moment) for moment in MOMENTS}
    body = [[category.replace("_", " "), *[mb(figures[moment][category]) for moment in MOMENTS]]
            for category in CATEGORIES]
    body.append(["total", *[mb(sum(figures[moment].values())) for moment in MOMENTS]])
    host = [sum(walk.moments[moment]["host"].values()) for moment in MOMENTS]
    if any(host):  # offload: the part of the total that lives on the host
        body.append(["of which on the host", *[mb(nbytes) for nbytes in host]])
    return ["MB per rank", *[moment.replace("_", " ") for moment in MOMENTS]], body


def peak_line(walk: Walkthrough) -> str:
    """`Walkthrough.peak` in words."""
    peak = walk.peak()
    line = f"peak (model states and ZeRO++'s temporaries, no activations): {mb(peak['bytes'])} MB in {peak['phase']}"
    if peak["temporary_bytes"]:
        return (line + f": {peak['moment'].replace('_', ' ')} + {mb(peak['temporary_bytes'])} MB of temporaries "
                f"({peak['temporary_of']})")
    return line + f" ({peak['moment'].replace('_', ' ')})"


def runs(collectives: list[dict]) -> list[list[dict]]:
    """Consecutive collectives of one phase, op and payload, together."""
    return [list(run) for _, run in groupby(collectives, key=lambda item: (item["phase"], item["op"],
                                                                           item["payload_bytes"]))]


def tally(collectives: list[dict]) -> Counter:
    """How many calls of each op and payload, in the order each first appears (a phase's summary:
    stage 3's calls of different sizes interleave)."""
    return Counter((item["op"], item["payload_bytes"]) for item in collectives)


def describe_run(run: list[dict]) -> str:
    first, last = run[0].get("what", ""), run[-1].get("what", "")
    return first if len(run) == 1 else f"{first} ... {last}"


def phases_table(walk: Walkthrough) -> tuple[list[str], list[list[str]]]:
    payload = walk.to_json()
    body = []
    for phase in payload["phases"]:
        moved = [item for item in payload["collectives"] if item["phase"] == phase["name"]]
        moves = ", ".join(f"{count} x {op} {mb(payload_bytes)} MB"
                          for (op, payload_bytes), count in tally(moved).items())
        holds = phase["holds"]
        body.append([phase["name"], phase["engine_call"], f"{holds.replace('_', ' ')}: {mb(sum(walk.moment_bytes(holds).values()))} MB",
                     moves or "nothing", mb(sum(item["payload_bytes"] for item in moved)),
                     mb(sum(item["wire_bytes"] for item in moved))])
    return ["phase", "engine call", "one rank holds after it", "what moves", "payload MB", "wire MB"], body


# A layer's index in a name: the number between dots after a container (`model.layers.3.mlp`).
LAYER_INDEX = re.compile(r"(?<=\.)(\d+)(?=\.)")


def layer_of(run: list[dict]) -> int | None:
    """The one layer every call of a run names (the first index in each name), else None."""
    found = {match[1] if (match := LAYER_INDEX.search(item.get("what", ""))) else None for item in run}
    return int(found.pop()) if len(found) == 1 and None not in found else None


def run_shape(run: list[dict]) -> tuple:
    """What a run is apart from its layer: phase, op, calls, bytes and names with the index taken out."""
    return (run[0]["phase"], run[0]["op"], len(run), run[0]["payload_bytes"], run[0]["wire_bytes"],
            tuple(LAYER_INDEX.sub("{}", item.get("what", ""), count=1) for item in run))


def layer_block(found: list[list[dict]], start: int, layer: int) -> list[list[dict]]:
    """The consecutive runs from `start` that name `layer`."""
    end = start
    while end < len(found) and layer_of(found[end]) == layer:
        end += 1
    return found[start:end]


def layer_groups(found: list[list[dict]]) -> list[tuple[list[dict], list[int]]]:
    """Each run in order with the layers it stands for: consecutive runs of one layer form a block,
    and blocks of consecutive layers with the same shapes are told once, each of their runs with
    every layer they cover; any other run stands for itself alone (no layers)."""
    grouped, index = [], 0
    while index < len(found):
        layer = layer_of(found[index])
        if layer is None:
            grouped.append((found[index], []))
            index += 1
            continue
        block, layers = layer_block(found, index, layer), [layer]
        shapes, index = [run_shape(run) for run in block], index + len(block)
        while (following := layer_block(found, index, layers[-1] + 1)) and [run_shape(run) for run in following] == shapes:
            layers.append(layers[-1] + 1)
            index += len(following)
        grouped += [(run, layers if len(layers) > 1 else []) for run in block]
    return grouped


def describe_layers(run: list[dict], layers: list[int]) -> str:
    """A repeated run named once, its layer index given as the range it covers."""
    span = f"{layers[0]}-{layers[-1]}"
    first, last = (LAYER_INDEX.sub(span, item.get("what", ""), count=1) for item in (run[0], run[-1]))
    return first if len(run) == 1 else f"{first} ... {last}"


def collectives_table(collectives: list[dict]) -> tuple[list[str], list[list[str]]]:
    """One row per run of equal calls, and one for a run that repeats layer after layer (its calls
    "per layer x N layers"); the total counts every call."""
    body = []
    for run, layers in layer_groups(runs(collectives)):
        calls = f"{len(run)} x {len(layers)} layers" if layers else str(len(run))
        what = describe_layers(run, layers) if layers else describe_run(run)
        body.append([run[0]["phase"], run[0]["op"], calls, mb(run[0]["payload_bytes"]), mb(run[0]["wire_bytes"]), what])
    body.append(["total", "", str(len(collectives)), mb(sum(item["payload_bytes"] for item in collectives)),
                 mb(sum(item["wire_bytes"] for item in collectives)), ""])
    return ["phase", "op", "calls", "payload MB each", "wire MB each", "buffers, buckets"], body


def title(walk: Walkthrough, config_source: str) -> str:
    return (f"{walk.model}: {walk.parameters:,} parameters, ZeRO stage {walk.stage}, {walk.world_size} ranks, "
            f"{walk.precision}, {walk.micro_steps} micro-step(s) per step ({config_source})")


def phase_notes() -> list[str]:
    return [f"- `{name}` ({call}): {summary}" for name, (call, _, summary) in PHASES.items()]


def render_markdown(walk: Walkthrough, config_source: str, measurement_sections: list[str] = ()) -> str:
    """The walk-through as one markdown document, for a report."""
    buffers = [f"- `{buffer.name}`: {buffer.layout.numel:,} elements, padded to {buffer.layout.padded_numel:,}, "
               f"{buffer.layout.partition_numel:,} per rank{' (sharded between uses)' if buffer.sharded else ''}"
               for buffer in walk.buffers]
    sections = [
        f"# One optimizer step of nano: {title(walk, config_source)}", "",
        "## Flat buffers", "", *buffers, "",
        "## The step, phase by phase", "", markdown_table(*phases_table(walk)), "", *phase_notes(), "",
        "## What one rank holds", "", markdown_table(*holdings_table(walk)), "", peak_line(walk), "",
        "## What moves", "",
        "Payload: the whole array; wire: what one rank sends for it (NCCL-tests' bus bytes, docs/log-format.md).", "",
        markdown_table(*collectives_table(walk.to_json()["collectives"])), "",
        *measurement_sections,
    ]
    return "\n".join(sections).rstrip() + "\n"
