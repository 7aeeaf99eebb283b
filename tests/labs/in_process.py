"""A lab's runs trained in one spawned world instead of one `zero-lab lab check` launch each: nano and
any number of lab engines (the reference solution with a mistake planted, one package each) on the
same ranks, one after another, each laid out and summarized as `lab check` lays out and summarizes
its launches, so that the lab check's own comparisons (`zero_lab.labs.check`) judge them.

Phase 1 (pytest): each engine's run as `lab check` prepares it (`lab_cmd.shared_settings`,
         `jobs.prepare`: the same config and harness arguments `torchrun.train_arguments` gives
         torchrun), its config written where the launch writes it.
Phase 2 (each rank): per run, the environment a launch gives the harness (the log contract, the
         flight record, rank 0's parameter norms), then `train(*prepare(argv))` with each rank's
         standard output kept as `logs/rank<N>.stdout.log`, as torchrun's per-rank logs are collected.
Phase 3 (pytest): `rundir.summarize`, the launcher's own summary code, on each run.
A run that raises fails the world (every rank runs the same code, so all raise together): the
mistakes whose check is "runs" (a rank stops) stay on `lab check` launches (tests/labs/lab_runs.py).
Importing a torch-free engine package per run is what a fresh rank does; each package here has a
name of its own (its directory's), so no run meets another's modules.
"""

from __future__ import annotations

import contextlib
import io
import os
import shutil
from dataclasses import replace
from pathlib import Path

from tests.spawn import run_distributed
from zero_lab.analysis.runs import rundir
from zero_lab.cli import jobs
from zero_lab.cli.lab_cmd import LEARNER, RUNS, shared_settings
from zero_lab.labs.catalog import Lab
from zero_lab.labs.start import SKELETON_FILES, lab_source
from zero_lab.launch import torchrun
from zero_lab.launch.engine_switch import LOG_CONTRACT
from zero_lab.workload.meters.collective_record import RECORD_DIRECTORY_ENVIRONMENT
from zero_lab.workload.meters.parameter_norms import PARAMETER_NORMS_ENVIRONMENT, PARAMETER_NORMS_FILE

SKELETON = Path(__file__).resolve().parents[2] / "zero_lab" / "labs" / "skeleton"


def engine_package(root: Path, name: str, lab_text: str) -> Path:
    """A lab package as `lab start` writes it, with `lab_text` as its lab.py, in root/<name>."""
    directory = root / name
    directory.mkdir(parents=True)
    for file in SKELETON_FILES:
        shutil.copy(SKELETON / file, directory / file)
    (directory / "lab.py").write_text(lab_text)
    return directory


def _train(rank: int, world_size: int, runs: list[tuple[str, list[str]]]) -> list[str]:
    """Phase 2 on one rank."""
    from zero_lab.harness.train import prepare, train

    os.environ["LOCAL_WORLD_SIZE"] = str(world_size)
    os.environ[LOG_CONTRACT] = "1"
    for run_dir, argv in runs:
        logs = Path(run_dir) / "logs"
        os.environ[RECORD_DIRECTORY_ENVIRONMENT] = str(logs)
        os.environ[PARAMETER_NORMS_ENVIRONMENT] = str(logs / PARAMETER_NORMS_FILE)
        output = io.StringIO()
        with contextlib.redirect_stdout(output):
            train(*prepare(argv))
        (logs / f"rank{rank}.stdout.log").write_text(output.getvalue())
    return []


def lab_runs(lab: Lab, engines: dict[str, Path], root: Path, world_size: int = 2) -> dict[str, dict]:
    """{name: summary} of nano's run and of each engine's (name -> its package), trained in one world
    of `world_size` ranks; "nano" names nano's."""
    shared = shared_settings(lab, root.resolve(), lab.steps)
    jobs_by_name = {"nano": jobs.prepare(shared, "nano", lab.stage, world_size, root / RUNS / "nano")}
    for name, package in engines.items():
        own = replace(shared, own_engines={LEARNER: package.resolve()})
        jobs_by_name[name] = jobs.prepare(own, LEARNER, lab.stage, world_size, root / RUNS / name)
    runs = []
    for job in jobs_by_name.values():  # Phase 1
        (job.run_dir / "logs").mkdir(parents=True)
        (job.run_dir / "console.log").touch()  # torchrun's console: nothing here beyond the ranks' logs
        rundir.write_json(job.spec.config_path, job.config)
        runs.append((str(job.run_dir), torchrun.train_arguments(job.spec)))
    failures = run_distributed(_train, world_size, runs)
    assert failures == [], "\n".join(failures)
    summaries = {}
    for name, job in jobs_by_name.items():  # Phase 3
        summary = rundir.summarize(job.run_dir, sorted((job.run_dir / "logs").glob("rank*.log")), impl=job.spec.impl,
                                   stage=lab.stage, dtype=lab.dtype, offload="none", launched_world_size=world_size,
                                   exit_code=0, interrupted_by=None, duration_s=0.0)
        summaries[name] = {**summary, "config": job.config}
    return summaries
