"""`compare --gpus 1,2 --device cuda` on a machine with one GPU (pretended; the runs are the recorded
tiny comparison's, handed back in place of launches): the world size that fits runs, the other's
cells are rows marked "needs 2 GPUs (1 visible)", which fail nothing (issue 31). With no world size
that fits, the refusal is as before: one line, exit 2."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from tests.analysis import golden_cases
from zero_lab.cli import environment, input_checks, jobs
from zero_lab.cli.app import app

COMPARE = ["compare", "--device", "cuda", "--stages", "1,2", "--model", "tiny", "--steps", "3", "--device-memory", "80"]


@pytest.fixture
def one_gpu(monkeypatch):
    """A machine whose torch sees one GPU; each prepared run returns its recorded summary."""
    monkeypatch.setattr(environment, "cuda_devices", lambda: ["NVIDIA H200"])
    monkeypatch.setattr(input_checks, "cuda_devices", lambda: ["NVIDIA H200"])
    launched = []

    def run_jobs(prepared, env):
        recorded = {(summary["stage"], summary["impl"]): summary for summary in golden_cases.recorded_summaries()}
        launched.extend((job.spec.nproc, job.spec.stage, job.spec.impl) for job in prepared)
        return [dict(recorded[(job.spec.stage, job.spec.impl)], world_size=job.spec.nproc) for job in prepared], None

    monkeypatch.setattr(jobs, "run_jobs", run_jobs)
    return launched


def test_the_cells_that_fit_run_and_the_others_are_marked(one_gpu, tmp_path):
    result = CliRunner().invoke(app, [*COMPARE, "--gpus", "1,2", "--out", str(tmp_path), "--format", "json"])
    assert result.exit_code == 0, result.stderr
    assert one_gpu == [(1, stage, impl) for stage in (1, 2) for impl in ("nano", "official")]
    assert "note: --gpus 2 needs 2 GPUs (1 visible): its cells are not run, and marked so" in result.stderr
    comparison = json.loads(result.stdout)
    marked = [row for row in comparison["rows"] if row["world_size"] == 2]
    assert [(row["stage"], row["impl"], row["status"], row["error"]) for row in marked] == [
        (stage, impl, "not_run", "needs 2 GPUs (1 visible)") for stage in (1, 2) for impl in ("nano", "official")]
    assert comparison["verdict"]["ok"] and comparison["verdict"]["failed_runs"] == []
    assert comparison["verdict"]["not_run"] == [f"world_size=2 stage={stage} impl={impl}: not run, needs 2 GPUs "
                                                "(1 visible)" for stage in (1, 2) for impl in ("nano", "official")]
    assert all(delta["world_size"] == 1 for delta in comparison["deltas"])


def test_the_runs_table_says_what_a_marked_cell_needs(one_gpu, tmp_path):
    result = CliRunner().invoke(app, [*COMPARE, "--gpus", "1,2", "--out", str(tmp_path)], terminal_width=250)
    assert result.exit_code == 0, result.stderr
    lines = [line for line in result.stdout.splitlines() if "needs 2 GPUs (1 visible)" in line]
    assert len(lines) == 4 + 4  # the runs table's four rows, the verdict's four lines


def test_with_no_world_size_that_fits_the_command_is_refused(one_gpu, tmp_path):
    result = CliRunner().invoke(app, [*COMPARE, "--gpus", "2,4", "--out", str(tmp_path)])
    assert result.exit_code == 2 and one_gpu == []
    assert result.stderr.startswith("error: --gpus 2 asks for 2 processes per node but 1 CUDA devices are visible")
