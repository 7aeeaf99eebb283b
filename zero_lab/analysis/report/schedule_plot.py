"""`zero-lab doctor RUN --plot FILE`: the ranks' collectives, call by call, up to the call where
they part (the `collective-mismatch` finding, drawn).

Every rank of a process group must issue the same collectives in the same order: the n-th call of
one rank meets the n-th call of every other. The picture puts one row per rank and one column per
call number, so a reader sees the calls that agree line up and the first one that does not.

Phase 1: `picture_numbers` takes, from the ranks' flight records, the call where they part
         (`diagnosis.mismatch.first_difference`) and the WINDOW calls before it, each as call
         number, op, payload bytes and where the rank was (a step, the engine call, a stage-3 unit).
         Nothing after the parting call: which calls a rank still made there depends on timing.
Phase 2: `draw` lays them out, one box per call coloured by its collective family (the colours of
         every picture: `picture.OP_COLOURS`), the parting call outlined in red;
         `analysis.report.picture` saves the PNG with the numbers inside.
"""

from __future__ import annotations

from pathlib import Path

from zero_lab.analysis.diagnosis.mismatch import first_difference
from zero_lab.analysis.report.picture import OP_COLOURS, draw_picture
from zero_lab.workload.meters.collective_record import Record
from zero_lab.workload.meters.wire_bytes import family_of_name

WINDOW = 5  # agreeing calls drawn before the parting one
PARTING = "#C44E52"


def picture_numbers(title: str, records: dict[int, Record]) -> dict | None:
    """Phase 1 (None: the ranks' records do not part)."""
    found = first_difference(records)
    if found is None:
        return None
    parting, _ = found
    ranks = {}
    for rank, record in sorted(records.items()):
        ranks[str(rank)] = [[call.seq, call.op, call.payload_bytes, call.where()] for call in record.calls
                            if parting - WINDOW <= call.seq <= parting]
    return {"title": title, "parting": parting, "ranks": ranks}


def draw(numbers: dict):
    """Phase 2: a row per rank, a box per call."""
    parting, ranks = numbers["parting"], numbers["ranks"]

    def on(figure) -> None:
        axes = figure.add_axes((0.08, 0.3, 0.9, 0.56))
        used = {}
        for row, (rank, calls) in enumerate(ranks.items()):
            y = len(ranks) - 1 - row
            for seq, op, payload, where in calls:
                family = family_of_name(op) or op
                used[family] = OP_COLOURS.get(family, "#333333")
                edge, width = (PARTING, 3.0) if seq == parting else ("white", 1.0)
                axes.add_patch(_box(seq, y, used[family], edge, width))
                place = where.split(", ")[-1] if where else "start-up"
                axes.text(seq, y + 0.12, place, ha="center", va="center", fontsize=7, color="white")
                axes.text(seq, y - 0.16, f"{payload:,} B", ha="center", va="center", fontsize=7, color="white")
        first = min(call[0] for calls in ranks.values() for call in calls)
        axes.set_xlim(first - 0.6, parting + 0.6)
        axes.set_ylim(-0.6, len(ranks) - 0.4)
        axes.set_xticks(range(first, parting + 1))
        axes.set_xlabel("call number (each rank counts its own collectives)")
        axes.set_yticks(range(len(ranks)))
        axes.set_yticklabels([f"rank {rank}" for rank in reversed(list(ranks))])
        axes.set_title(f"{numbers['title']}: the ranks part at call {parting} (outlined)")
        for side in ("top", "right"):
            axes.spines[side].set_visible(False)
        from matplotlib.patches import Patch

        axes.legend(handles=[Patch(color=colour, label=name) for name, colour in used.items()],
                    loc="upper center", bbox_to_anchor=(0.5, -0.3), ncol=len(used), frameon=False)
    return on


def _box(seq: int, y: int, colour: str, edge: str, width: float):
    from matplotlib.patches import Rectangle

    return Rectangle((seq - 0.45, y - 0.35), 0.9, 0.7, facecolor=colour, edgecolor=edge, linewidth=width)


def plot_schedule(title: str, records: dict[int, Record], path: Path) -> Path | None:
    """The PNG at `path` (None, nothing written: the records do not part)."""
    numbers = picture_numbers(title, records)
    if numbers is None:
        return None
    return draw_picture(path, 9.0, 2.6, draw(numbers), numbers)
