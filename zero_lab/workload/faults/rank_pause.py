"""Named moments inside a training rank, where a fault test stops that rank so it can be killed.

A test of a lost rank kills one rank from outside the job (SIGKILL, as an OOM killer or a
rebooting node would) at a known point of training: a sleep before the kill lands too early on a
loaded machine and too late on a fast one. With `ZERO_LAB_RANK_PAUSE_AT=<rank>:<moment>` in the
job's environment, that rank, on the job's first attempt, prints one line on its stdout

    [rank 1 paused at save-4] pid=12345

and waits there for a signal. The other ranks run on until they need it (their next collective).
A comma-separated list names one pause per attempt (torchrun's `TORCHELASTIC_RESTART_COUNT`, 0
first): `1:save-4,0:step-5` pauses rank 1 at save-4 on the first attempt and rank 0 at step-5 on
the second; attempts beyond the list run through. A rank of `*` is every rank that has the variable:
given to one machine's launch alone, it pauses that machine's ranks (a test then kills the machine).

    step-<k>    after step k: its `[opt_step k]` line and its checkpoint, if it saves one, are out
    save-<k>    inside step k's save: every rank has written its checkpoint files, and `latest`
                still names the previous checkpoint (rank 0 waits at the barrier before it)

Without the variable, `reached` costs one look-up in the environment.
"""

from __future__ import annotations

import os
import signal
import sys

PAUSE_VARIABLE = "ZERO_LAB_RANK_PAUSE_AT"
MOMENT_KINDS = ("step", "save")
ANY_RANK = "*"  # every rank whose environment holds the variable: on several machines, that machine's ranks


def restart_attempt() -> int:
    """Which attempt of the job this is: 0 first, 1 after torchrun's first restart of the workers, ..."""
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))


def pause_line(rank: int, moment: str) -> str:
    """The line a paused rank prints (tests wait for it)."""
    return f"[rank {rank} paused at {moment}] pid={os.getpid()}"


def requested(value: str | None, attempt: int) -> tuple[int | str, str] | None:
    """(rank, moment) that `ZERO_LAB_RANK_PAUSE_AT` names for `attempt`, None when none; ValueError
    when an entry is malformed."""
    entries = value.split(",") if value else []
    for entry in entries:
        rank, _, moment = entry.partition(":")
        kind, _, step = moment.rpartition("-")
        if not (rank.isdigit() or rank == ANY_RANK) or kind not in MOMENT_KINDS or not step.isdigit():
            raise ValueError(f"{PAUSE_VARIABLE}={value!r}: {entry!r} is not <rank>:<moment> with a moment of "
                             f"{', '.join(kind + '-<step>' for kind in MOMENT_KINDS)}")
    if attempt >= len(entries):
        return None
    rank, _, moment = entries[attempt].partition(":")
    return (ANY_RANK if rank == ANY_RANK else int(rank)), moment


def reached(rank: int, kind: str, step: int) -> None:
    """Mark moment `<kind>-<step>` on `rank`; pause there when the environment asks for it."""
    value = os.environ.get(PAUSE_VARIABLE)
    moment = f"{kind}-{step}"
    wanted = requested(value, restart_attempt()) if value else None
    if wanted is None or wanted[1] != moment or wanted[0] not in (rank, ANY_RANK):
        return
    sys.stdout.write(pause_line(rank, moment) + "\n")
    sys.stdout.flush()
    while True:
        signal.pause()
