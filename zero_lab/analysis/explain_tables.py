"""The tables of `zero-lab explain`: a walk-through (and, with --measure, a measurement beside its
prediction) as (headers, rows) that the terminal and the markdown writer both print.

    holdings_table     what one rank holds at each moment, by category (MB)
    phases_table       the step phase by phase: the engine call, what a rank holds after it, what moves
    collectives_table  the collectives in order, a run of equal ones on one row
    peak_line          the peak of model states and ZeRO++'s temporaries, and where it is
"""

from __future__ import annotations

from collections import Counter
from itertools import groupby

from zero_lab.analysis.explain import MOMENTS, PHASES, Walkthrough
from zero_lab.analysis.markdown import fmt, markdown_table
from zero_lab.nano.memory_formula import CATEGORIES

MIB = 2**20


def mb(nbytes: int) -> str:
    return fmt(nbytes / MIB, 2)


def holdings_table(walk: Walkthrough) -> tuple[list[str], list[list[str]]]:
    figures = {moment: walk.moment_bytes(moment) for moment in MOMENTS}
    body = [[category.replace("_", " "), *[mb(figures[moment][category]) for moment in MOMENTS]]
            for category in CATEGORIES]
    body.append(["total", *[mb(sum(figures[moment].values())) for moment in MOMENTS]])
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
    stage 3's persistent parameters, one call each, interleave with the units' calls)."""
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


def collectives_table(collectives: list[dict]) -> tuple[list[str], list[list[str]]]:
    body = [[run[0]["phase"], run[0]["op"], str(len(run)), mb(run[0]["payload_bytes"]), mb(run[0]["wire_bytes"]),
             describe_run(run)] for run in runs(collectives)]
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
