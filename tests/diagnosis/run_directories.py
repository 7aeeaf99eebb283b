"""Run directories from spawned worlds: the harness's training (`prepare`, `train`) on the ranks of one
`tests.spawn.run_distributed` world, each run laid out as `zero-lab run` lays it out, so that
`zero-lab doctor` reads it as it reads a launched run.

Phase 1 (each rank): for each run in turn, the flight record asked for in `<run>/logs` (the
         launcher's environment variable), `train(*prepare(argv))`, rank 0's standard output kept
         as `logs/rank0.stdout.log`; the config the run was given beside it as `config.json`.
Phase 2 (pytest): `rundir.summarize`, the launcher's own summary code, writes each `summary.json`
         (exit code 0: every run here finished).
What a launch adds (torchrun's console, the other ranks' output, memory.csv) is not here; tests of
what the launch itself does use `zero-lab` commands (tests/diagnosis/test_mismatch_e2e.py).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from tests.spawn import run_distributed
from zero_lab.analysis.runs import rundir
from zero_lab.workload.meters.collective_record import RECORD_DIRECTORY_ENVIRONMENT

CONFIGS = Path(__file__).resolve().parents[2] / "zero_lab" / "harness" / "configs"


@dataclass
class HarnessRun:
    """One run: its impl, stage and dtype, the config (a dict; None: the harness's zero<stage>.json) and
    any further harness arguments."""

    impl: str
    stage: int
    dtype: str = "float32"
    config: dict | None = None
    arguments: list[str] = field(default_factory=list)

    def argv(self, directory: Path, workload: list[str]) -> list[str]:
        config = directory / "config.json"
        return ["--impl", self.impl, "--deepspeed_config", str(config), "--zero-stage", str(self.stage),
                "--model-dtype", self.dtype, "--device", "cpu", *workload, *self.arguments]


def harness_config(stage: int, **zero_keys) -> dict:
    """The harness's config for `stage`, with `zero_optimization` keys changed."""
    config = json.loads((CONFIGS / f"zero{stage}.json").read_text())
    config["zero_optimization"].update(zero_keys)
    return config


def _train_runs(rank: int, world_size: int, runs: dict[str, list[str]], directory: str) -> list[str]:
    """Phase 1 on one rank."""
    from zero_lab.harness.train import prepare, train

    os.environ["LOCAL_WORLD_SIZE"] = str(world_size)
    for name, argv in runs.items():
        logs = Path(directory) / name / "logs"
        os.environ[RECORD_DIRECTORY_ENVIRONMENT] = str(logs)
        output = io.StringIO()
        with contextlib.redirect_stdout(output):
            train(*prepare(argv))
        if rank == 0:
            (logs / "rank0.stdout.log").write_text(output.getvalue())
    os.environ.pop(RECORD_DIRECTORY_ENVIRONMENT)
    return []


def run_directories(world_size: int, runs: dict[str, HarnessRun], directory: Path, workload: list[str]) -> dict[str, Path]:
    """{name: run directory} of runs trained one after another in one world of `world_size` ranks."""
    argvs = {}
    for name, run in runs.items():
        run_dir = directory / name
        (run_dir / "logs").mkdir(parents=True)
        (run_dir / "console.log").touch()
        config = run.config or json.loads((CONFIGS / f"zero{run.stage}.json").read_text())
        rundir.write_json(run_dir / "config.json", config)
        argvs[name] = run.argv(run_dir, workload)
    failures = run_distributed(_train_runs, world_size, argvs, str(directory))
    assert failures == [], "\n".join(failures)
    for name, run in runs.items():  # Phase 2
        run_dir = directory / name
        summary = rundir.summarize(run_dir, sorted((run_dir / "logs").glob("rank*.log")), impl=run.impl,
                                   stage=run.stage, dtype=run.dtype, offload="none", launched_world_size=world_size,
                                   exit_code=0, interrupted_by=None, duration_s=0.0)
        rundir.write_summary(run_dir, {**summary, "config": json.loads((run_dir / "config.json").read_text())})
    return {name: directory / name for name in runs}
