"""Watch a run's memory while it lasts, and say whether a rank that died was killed for it.

The kernel's out-of-memory killer ends a rank with SIGKILL and leaves no line in any log: torchrun
only sees exit code -9. What tells it apart from any other SIGKILL is the memory just before.

Phase 1: the launcher starts the watch with torchrun. A thread samples every SAMPLE_EVERY_S: each
         local rank's resident set size (psutil; a worker is known by the RANK in its environment)
         and the memory the ranks could still take, under the tightest of three ceilings:
           the machine: psutil's available memory of its total;
           the container: its cgroup's limit less its usage (v2 `memory.max` - `memory.current`,
             v1 `memory.limit_in_bytes` - `memory.usage_in_bytes`), when a limit is set;
           a stated limit (`--device-memory GB` on CPU): the limit less the ranks' resident bytes,
             as if they ran alone in a container of that size.
         Every sample is a row of `memory.csv` in the run directory, kept with the logs.
Phase 2: once the run has ended, `leftover_workers()` are the ranks its agent left running (the
         launcher stops them), and `out_of_memory(rank, exit_code)` applies the rule: a rank killed
         by SIGKILL (exit code -9) was most likely killed for memory when, at some sample, less
         than NEARLY_EXHAUSTED_FRACTION of the ceiling was free, or when the container's cgroup
         counted an out-of-memory kill during the run (`oom_kill` in memory.events or
         memory.oom_control). It returns the one line that says so, with the figures.
"""

from __future__ import annotations

import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from zero_lab.launch.workers import rank_processes
from zero_lab.workload.log_contract.log_lines import MB, size_text

SAMPLE_EVERY_S = 0.25
# Finding the workers scans every process on the machine (tens of ms on a busy one), reading a
# known worker's memory does not: look for them again only this often, or while none is known.
FIND_WORKERS_EVERY = 8  # samples (2 s)
NEARLY_EXHAUSTED_FRACTION = 0.10  # less than a tenth of the ceiling free
CGROUP_ROOT = Path("/sys/fs/cgroup")  # tests point it at a directory of their own
NO_LIMIT = 1 << 60  # cgroup v1 writes "no limit" as a number near 2^63
CSV_HEADER = "time_s,rank,rss_mb,available_mb,ceiling_mb,ceiling\n"


@dataclass(frozen=True)
class Ceiling:
    """The memory the ranks can use: its name, its size and what of it is free (bytes)."""

    name: str
    total: int
    available: int

    @property
    def nearly_exhausted(self) -> bool:
        return self.available < NEARLY_EXHAUSTED_FRACTION * self.total


def read_number(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def cgroup_files(root: Path) -> tuple[Path, Path, Path] | None:
    """(limit, usage, events) of the cgroup: v2 at the root, else v1's memory controller."""
    if (root / "memory.max").is_file():
        return root / "memory.max", root / "memory.current", root / "memory.events"
    v1 = root / "memory"
    if (v1 / "memory.limit_in_bytes").is_file():
        return v1 / "memory.limit_in_bytes", v1 / "memory.usage_in_bytes", v1 / "memory.oom_control"
    return None


def cgroup_ceiling(root: Path) -> Ceiling | None:
    """The container's limit and what is left of it; None when no limit is set ("max", 2^63)."""
    files = cgroup_files(root)
    if files is None:
        return None
    limit, usage = read_number(files[0]), read_number(files[1])
    if limit is None or usage is None or limit >= NO_LIMIT:
        return None
    return Ceiling("the container's cgroup limit", limit, max(0, limit - usage))


def cgroup_oom_kills(root: Path) -> int:
    """The cgroup's count of out-of-memory kills so far (0 when it keeps none)."""
    files = cgroup_files(root)
    if files is None:
        return 0
    try:
        lines = files[2].read_text().splitlines()
    except OSError:
        return 0
    for line in lines:
        name, _, value = line.partition(" ")
        if name == "oom_kill" and value.strip().isdigit():
            return int(value)
    return 0


def tightest_ceiling(ranks_resident: int, stated_limit: int | None, root: Path) -> Ceiling:
    """Phase 1: the ceiling with the least memory free, of the machine, the container and a stated limit."""
    machine = psutil.virtual_memory()
    ceilings = [Ceiling("the machine", machine.total, machine.available)]
    container = cgroup_ceiling(root)
    if container is not None:
        ceilings.append(container)
    if stated_limit is not None:
        ceilings.append(Ceiling("--device-memory", stated_limit, max(0, stated_limit - ranks_resident)))
    return min(ceilings, key=lambda ceiling: ceiling.available)


@dataclass
class MemoryRecord:
    """What the samples found: each rank's largest resident set, and the tightest moment."""

    rss_max: dict[int, int] = field(default_factory=dict)
    tightest: Ceiling | None = None
    nearly_exhausted: bool = False  # at some sample, less than NEARLY_EXHAUSTED_FRACTION was free

    def add(self, resident: dict[int, int], ceiling: Ceiling) -> None:
        for rank, size in resident.items():
            self.rss_max[rank] = max(size, self.rss_max.get(rank, 0))
        if self.tightest is None or ceiling.available < self.tightest.available:
            self.tightest = ceiling
        self.nearly_exhausted = self.nearly_exhausted or ceiling.nearly_exhausted

    def rss_max_mb(self) -> float | None:
        return max(self.rss_max.values()) / MB if self.rss_max else None


def out_of_memory_message(rank: int | None, exit_code: int | None, record: MemoryRecord,
                          oom_kills: int) -> str | None:
    """Phase 2: the line for a rank killed, most likely, for memory; None when the rule does not hold."""
    if exit_code != -signal.SIGKILL or not (record.nearly_exhausted or oom_kills > 0):
        return None
    held = record.rss_max.get(rank) if rank is not None else None
    who = f"rank {rank} held {size_text(held)} resident" if held is not None else f"rank {rank}"
    tightest = record.tightest
    free = "" if tightest is None else (f", {size_text(tightest.available, like=tightest.total)} of "
                                        f"{size_text(tightest.total)} was free ({tightest.name})")
    counted = f"; the container counted {oom_kills} out-of-memory kill(s)" if oom_kills else ""
    return f"killed, most likely out of memory: {who}{free}{counted}"


class MemoryWatch:
    """Samples one launch's ranks (Phase 1); a context manager around the stream, like StallWatch."""

    def __init__(self, process: subprocess.Popen, csv_path: Path, stated_limit: int | None = None,
                 cgroup_root: Path | None = None):
        self.process, self.csv_path, self.stated_limit = process, csv_path, stated_limit
        self.cgroup_root = cgroup_root or CGROUP_ROOT
        self.record = MemoryRecord()
        self.workers: dict[int, psutil.Process] = {}
        self.seen: dict[int, psutil.Process] = {}  # every worker found while the run lasted, by pid
        self.samples = 0
        self.started = time.monotonic()
        self.oom_kills_before = cgroup_oom_kills(self.cgroup_root)
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="memory-watch", daemon=True)

    def sample(self, sink) -> None:
        """One sample of every rank and the tightest ceiling: recorded, and written to memory.csv."""
        if not self.workers or self.samples % FIND_WORKERS_EVERY == 0:
            self.workers = rank_processes(self.process.pid)
            self.seen.update({worker.pid: worker for worker in self.workers.values()})
        self.samples += 1
        resident = {}
        for rank, worker in list(self.workers.items()):
            try:
                resident[rank] = worker.memory_info().rss
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                del self.workers[rank]
        ceiling = tightest_ceiling(sum(resident.values()), self.stated_limit, self.cgroup_root)
        self.record.add(resident, ceiling)
        elapsed = time.monotonic() - self.started
        for rank, size in sorted(resident.items()):
            sink.write(f"{elapsed:.2f},{rank},{size / MB:.1f},{ceiling.available / MB:.1f},"
                       f"{ceiling.total / MB:.1f},{ceiling.name}\n")

    def _watch(self) -> None:
        with open(self.csv_path, "w", buffering=1) as sink:  # line by line: a test or a person can follow it
            sink.write(CSV_HEADER)
            while True:
                self.sample(sink)
                if self._done.wait(SAMPLE_EVERY_S):
                    return

    def out_of_memory(self, rank: int | None, exit_code: int | None) -> str | None:
        """Phase 2, once the run has ended."""
        return out_of_memory_message(rank, exit_code, self.record,
                                     cgroup_oom_kills(self.cgroup_root) - self.oom_kills_before)

    def leftover_workers(self) -> list[psutil.Process]:
        """Workers seen during the run that still run once it has ended: a torchrun agent that died
        (killed, or lost) leaves its ranks behind, each in a session of its own, out of reach of the
        agent's process group (psutil's is_running also checks the start time: a reused pid is not one)."""
        return [worker for worker in self.seen.values() if worker.is_running()]

    def __enter__(self) -> MemoryWatch:
        self._thread.start()
        return self

    def __exit__(self, *exception) -> None:
        self._done.set()
        self._thread.join()
