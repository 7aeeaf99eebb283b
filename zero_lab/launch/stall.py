"""Stop a run that makes no progress: no `[opt_step]` line for --stall-timeout seconds.

A stopped or deadlocked rank does not crash: its peers wait in a collective, rank 0 prints
nothing more, and the job would hold its processes forever. `StallWatch` bounds that wait.

Phase 1: the launcher starts the watch with torchrun, and calls `progressed(step)` for every
         `[opt_step]` line it streams; the clock starts at launch, so start-up counts as well.
Phase 2: a thread looks once a second; past the timeout it notes each worker's rank and process
         state (a SIGSTOPped rank shows as `stopped`, its peers waiting in a collective as
         `sleeping`) in `message`, then stops the process tree. The stream ends, and the launcher
         writes the summary with status `stalled`.
"""

from __future__ import annotations

import subprocess
import threading
import time
from collections.abc import Callable

import psutil

from zero_lab.launch.workers import rank_processes

CHECK_EVERY_S = 1.0


def worker_states(torchrun_pid: int) -> dict[int, str]:
    """{global rank: process state} of torchrun's worker processes on this node."""
    states = {}
    for rank, worker in rank_processes(torchrun_pid).items():
        try:
            states[rank] = worker.status()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return states


def stall_message(timeout_s: float, last_step: int, total_steps: int | None, states: dict[int, str]) -> str:
    """The one line a stall is reported with: how long, after which step (of how many, when known:
    a user's script decides its own), which ranks in which state."""
    of = f" of {total_steps}" if total_steps else ""
    where = f"after step {last_step}{of}" if last_step else f"before step 1{of}"
    ranks = ", ".join(f"{rank} ({state})" for rank, state in sorted(states.items())) or "none running"
    return (f"stalled: no [opt_step] progress for {timeout_s:g} s {where} (--stall-timeout {timeout_s:g}); "
            f"ranks that stopped reporting: {ranks}")


class StallWatch:
    """Watches one launch; timeout_s 0 watches nothing. Use as a context manager around the stream."""

    def __init__(self, process: subprocess.Popen, timeout_s: float, total_steps: int | None,
                 stop: Callable[[subprocess.Popen], None]):
        self.process, self.timeout_s, self.total_steps, self.stop = process, timeout_s, total_steps, stop
        self.last_progress = time.monotonic()
        self.last_step = 0
        self.message: str | None = None  # set once the watch has stopped the run
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="stall-watch", daemon=True)

    def progressed(self, step: int) -> None:
        """Phase 1: a step line arrived."""
        self.last_step, self.last_progress = step, time.monotonic()

    def _watch(self) -> None:
        """Phase 2."""
        while not self._done.wait(CHECK_EVERY_S):
            if time.monotonic() - self.last_progress >= self.timeout_s:
                self.message = stall_message(self.timeout_s, self.last_step, self.total_steps,
                                             worker_states(self.process.pid))
                self.stop(self.process)
                return

    def __enter__(self) -> StallWatch:
        if self.timeout_s > 0:
            self._thread.start()
        return self

    def __exit__(self, *exception) -> None:
        self._done.set()
        if self._thread.is_alive():
            self._thread.join()
