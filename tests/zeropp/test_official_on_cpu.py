"""Official DeepSpeed 0.19.8 cannot run qwZ or qgZ on CPU (its quantizer kernels are CUDA only: "This op
had not been implemented on CPU backend"): `compare` says so in one line and runs nano alone. The
decision is a pure function of the config and the device; nothing here launches a run."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from typer.testing import CliRunner

from zero_lab.cli import compare_cmd, jobs
from zero_lab.cli.app import app
from zero_lab.launch import torchrun

runner = CliRunner()


def zero3(**keys) -> dict:
    config = json.loads((torchrun.CONFIG_DIR / "zero3.json").read_text())
    config["zero_optimization"].update(keys)
    return config


def test_the_quantized_keys_on_cpu_and_only_there_stop_official():
    for keys in ({"zero_quantized_weights": True}, {"zero_quantized_gradients": True},
                 {"zero_quantized_weights": True, "zero_quantized_gradients": True}):
        reason = jobs.official_cannot_run(zero3(**keys), "cpu")
        assert reason is not None and all(key in reason for key in keys), reason
        assert "This op had not been implemented on CPU backend" in reason
        assert jobs.official_cannot_run(zero3(**keys), "cuda") is None
    assert jobs.official_cannot_run(zero3(zero_hpz_partition_size=2), "cpu") is None  # official trains with hpZ on CPU
    assert jobs.official_cannot_run(zero3(zero_quantized_weights=False), "cpu") is None
    assert jobs.official_cannot_run({}, "cpu") is None


def test_compare_drops_official_and_says_so_in_one_line(tmp_path, capsys):
    path = tmp_path / "qwz.json"
    path.write_text(json.dumps(zero3(zero_quantized_weights=True)))
    shared = SimpleNamespace(config_path=path, device="cpu")
    assert jobs.impls_that_can_run(shared, ["nano", "official"]) == ["nano"]
    assert jobs.impls_that_can_run(shared, ["official", "nano", "fsdp2"]) == ["nano", "fsdp2"]
    assert jobs.impls_that_can_run(SimpleNamespace(config_path=path, device="cuda"), ["nano", "official"]) == [
        "nano", "official"]
    assert jobs.impls_that_can_run(SimpleNamespace(config_path=None, device="cpu"), ["nano", "official"]) == [
        "nano", "official"]


def test_compare_runs_nano_alone_and_official_alone_is_bad_input(tmp_path, monkeypatch):
    path = tmp_path / "qwz.json"
    path.write_text(json.dumps(zero3(zero_quantized_weights=True, stage3_prefetch_bucket_size=0)))
    prepared = []

    def no_launch(chosen, environment):
        prepared.extend(job.label for job in chosen)
        return [], "SIGINT"  # stopped before any launch: compare ends there

    monkeypatch.setattr(compare_cmd.jobs, "run_jobs", no_launch)
    arguments = ["compare", "--gpus", "4", "--ranks-per-node", "2", "--device", "cpu", "--model", "tiny", "--stages", "3",
                 "--config", str(path)]
    result = runner.invoke(app, [*arguments, "--out", str(tmp_path / "runs")])
    notes = [line for line in result.stderr.splitlines() if line.startswith("note: ")]
    assert notes == ['note: official DeepSpeed cannot run zero_quantized_weights on CPU (its quantizer: "This op had '
                     'not been implemented on CPU backend"); running nano alone'], result.stderr
    assert prepared == ["nano w4 s3"], prepared
    result = runner.invoke(app, [*arguments, "--impls", "official", "--out", str(tmp_path / "runs2")])
    assert result.exit_code == 2 and "Traceback" not in result.output, result.output
    errors = [line for line in result.stderr.splitlines() if not line.startswith("warning: ")]  # cores, machine's
    assert len(errors) == 1 and errors[0].startswith("error: official DeepSpeed cannot run zero_quantized_weights"), errors
