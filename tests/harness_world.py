"""The harness's training (`zero_lab.harness.train`'s `prepare` and `train`) on the ranks of one
spawned world: several runs one after another, each with its own command line, and each run's
rank-0 output for the test to read.

A torchrun launch of harness/train.py starts a fresh interpreter per rank that imports torch,
transformers, nano and official DeepSpeed again (about 5 CPU seconds a rank on 2 cores); the
ranks of `tests.spawn.run_distributed` fork with them imported. Use it where what a test checks
is what the training computes (losses, bytes, memory), not the launch: tests/harness/
test_train_torchrun.py keeps the torchrun path itself under test.

Phase 1 (pytest): run_distributed starts `world_size` ranks with `_train_runs` and the runs.
Phase 2 (each rank): the environment torchrun would give (LOCAL_WORLD_SIZE: every rank on one
         machine), then for each run in order `train(*prepare(argv))` in the world's process
         group (the engines' `init_distributed` finds it made), rank 0's standard output caught
         in memory and written to `<directory>/<name>.log`.
Phase 3 (pytest): a failure of any rank fails the caller; else {name: rank-0 output}.
`Worlds` does it lazily for a test module: the first output asked of a world trains all its runs.

Official DeepSpeed trains once per world: its communication backend, made at its first
`init_distributed`, keeps the collectives it found then (the first run's meters) for the life of
the process, so a second run's meter would count the same bytes under other collectives' names.
nano and FSDP2 look their collectives up at each call.
"""

from __future__ import annotations

import contextlib
import io
import os
from pathlib import Path
from typing import Callable

from tests.spawn import run_distributed


def _train_runs(rank: int, world_size: int, runs: dict[str, list[str]], directory: str) -> list[str]:
    from zero_lab.harness.train import prepare, train

    os.environ["LOCAL_WORLD_SIZE"] = str(world_size)
    for name, argv in runs.items():
        output = io.StringIO()
        with contextlib.redirect_stdout(output):
            train(*prepare(argv))
        if rank == 0:
            (Path(directory) / f"{name}.log").write_text(output.getvalue())
    return []


def train_in_world(world_size: int, runs: dict[str, list[str]], directory: Path) -> dict[str, str]:
    """{name: rank-0 output} of each run (harness/train.py's arguments) in one world of `world_size` ranks."""
    directory.mkdir(parents=True, exist_ok=True)
    failures = run_distributed(_train_runs, world_size, runs, str(directory))
    assert failures == [], "\n".join(failures)
    return {name: (directory / f"{name}.log").read_text() for name in runs}


class Worlds:
    """Worlds of `world_size` ranks, each a list of named runs, trained when one of their runs is
    first asked for (a test module's fixture: tests that need no world of a kind do not pay for it).
    `worlds`: {world: {run name: harness arguments}}; `directory(world)` makes a fresh directory."""

    def __init__(self, world_size: int, worlds: dict[str, dict[str, list[str]]], directory: Callable[[str], Path]):
        self.world_size, self.worlds, self.directory = world_size, worlds, directory
        self.outputs: dict[str, str] = {}

    def output(self, name: str) -> str:
        """Run `name`'s rank-0 output."""
        if name not in self.outputs:
            world = next(world for world, runs in self.worlds.items() if name in runs)
            self.outputs.update(train_in_world(self.world_size, self.worlds[world], self.directory(world)))
        return self.outputs[name]
