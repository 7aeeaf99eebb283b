"""torchrun's worker processes on this node, by global rank (the stall and memory watches read them)."""

from __future__ import annotations

import psutil


def rank_processes(torchrun_pid: int) -> dict[int, psutil.Process]:
    """{global rank: process} of torchrun's workers, each known by the RANK in its environment."""
    found = {}
    try:
        workers = psutil.Process(torchrun_pid).children()
    except psutil.NoSuchProcess:
        return found
    for worker in workers:
        try:
            rank = worker.environ().get("RANK")
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        if rank is not None and rank.isdigit():
            found[int(rank)] = worker
    return found
