"""Named moments in a command's life, where a test can stop it on purpose.

A fault test must interrupt a command at a known point: a sleep before the signal lands too late
on a fast machine and too early on a loaded one. With `ZERO_LAB_PAUSE_AT=<moment>` in its
environment, a command that reaches that moment prints `[paused at <moment>]` on stderr and waits
there until a signal comes (Ctrl-C, SIGTERM, SIGHUP), which then acts exactly as it would at that
point. Without the variable, `reached` costs one look-up in the environment.

    cli-started         the executable runs; the app is not imported yet
    directory-claimed   the run (or comparison) directory exists; nothing is written into it yet
    launching           a run's configs are written; torchrun is about to start
    launched            torchrun has started; no step has come yet

This module imports nothing of zero_lab, so the executable can reach its first moment at once.
"""

from __future__ import annotations

import os
import signal
import sys

PAUSE_VARIABLE = "ZERO_LAB_PAUSE_AT"
MOMENTS = ("cli-started", "directory-claimed", "launching", "launched")


def reached(moment: str) -> None:
    """Mark `moment`; when the environment asks to pause there, announce it and wait for a signal
    (its handler raises out of the wait, as it would have raised here)."""
    if moment not in MOMENTS:
        raise ValueError(f"unknown moment {moment!r}; the moments are {', '.join(MOMENTS)}")
    if os.environ.get(PAUSE_VARIABLE) != moment:
        return
    print(f"[paused at {moment}]", file=sys.stderr, flush=True)
    while True:
        signal.pause()
