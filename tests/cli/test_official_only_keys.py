"""Config keys official DeepSpeed knows and nano does not: `--impl official` passes them through with
one warning, nano refuses them in one line that names `--impl official` as the fix (issue 23 item 1)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from zero_lab.cli.app import app
from zero_lab.launch import torchrun

runner = CliRunner()
ZERO_LAB = str(Path(sys.executable).with_name("zero-lab"))
# flops_profiler at step 1 makes official print its profile: proof that the key reached it.
OFFICIAL_ONLY = {"flops_profiler": {"enabled": True, "profile_step": 1, "detailed": False},
                 "zero_optimization": {"stage": 2, "round_robin_gradients": True}}


def config_file(tmp_path: Path) -> Path:
    """The harness's own zero2.json plus the keys only official knows."""
    config = json.loads((torchrun.CONFIG_DIR / "zero2.json").read_text())
    config["flops_profiler"] = OFFICIAL_ONLY["flops_profiler"]
    config["zero_optimization"].update(OFFICIAL_ONLY["zero_optimization"])
    path = tmp_path / "with-official-only-keys.json"
    path.write_text(json.dumps(config))
    return path


@pytest.mark.parametrize("command", [["run", "--impl", "nano"], ["compare"], ["compare", "--impls", "official,nano"]],
                         ids=["run-nano", "compare-both", "compare-official-first"])
def test_nano_refuses_an_official_only_key_in_one_line_naming_impl_official(tmp_path, monkeypatch, command):
    from zero_lab.launch import torchrun_job

    monkeypatch.setattr(torchrun_job.subprocess, "Popen", lambda *args, **kwargs: pytest.fail("bad input launched torchrun"))
    result = runner.invoke(app, [*command, "--device", "cpu", "--model", "tiny", "--config", str(config_file(tmp_path)),
                                 "--out", str(tmp_path / "runs")])
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in result.output, result.stderr
    assert "'flops_profiler' is known to official DeepSpeed but not implemented by nano" in lines[0], lines[0]
    assert "--impl official" in lines[0], lines[0]


def test_config_official_keeps_the_keys_only_official_knows(tmp_path):
    result = runner.invoke(app, ["config", "official", str(config_file(tmp_path)), "--device", "cpu"])
    assert result.exit_code == 0, result.output
    official = json.loads(result.stdout)
    assert official["flops_profiler"] == OFFICIAL_ONLY["flops_profiler"]
    assert official["zero_optimization"]["round_robin_gradients"] is True


def test_a_typo_is_still_refused_with_impl_official(tmp_path, monkeypatch):
    """Passing official's keys through is not passing everything: a key nobody knows is a typo."""
    from zero_lab.launch import torchrun_job

    monkeypatch.setattr(torchrun_job.subprocess, "Popen", lambda *args, **kwargs: pytest.fail("bad input launched torchrun"))
    typo = tmp_path / "typo.json"
    typo.write_text(json.dumps({"train_micro_batch_size_per_gpu": 2, "flops_profiler": {"enabled": False},
                                "zero_optimization": {"stage": 2, "reduce_bucket_sise": 10}}))
    result = runner.invoke(app, ["run", "--impl", "official", "--device", "cpu", "--model", "tiny", "--config", str(typo),
                                 "--out", str(tmp_path / "runs")])
    assert result.exit_code == 2, result.output
    assert "unknown config key 'zero_optimization.reduce_bucket_sise'" in result.stderr, result.stderr


@pytest.mark.slow
@pytest.mark.official
def test_run_impl_official_passes_official_only_keys_through_with_one_warning(tmp_path):
    """The README's advice, run: official trains with the keys, and says once that nano lacks them."""
    done = subprocess.run([ZERO_LAB, "run", "--impl", "official", "--gpus", "1", "--device", "cpu", "--model", "tiny",
                           "--steps", "2", "--config", str(config_file(tmp_path)), "--out", str(tmp_path / "runs"),
                           "--name", "official-only", "--format", "json"], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    run_dir = tmp_path / "runs" / "official-only"
    warned = [line for line in done.stderr.splitlines() if line.startswith("warning: config keys")]
    assert warned == ["warning: config keys flops_profiler, zero_optimization.round_robin_gradients are known to "
                      "official DeepSpeed but not implemented by nano: passed through to official DeepSpeed as they "
                      "are"], done.stderr
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "ok" and summary["steps"] == 2
    config_warnings = [warning for warning in summary["warnings"] if "kind=config" in warning]
    assert len(config_warnings) == 1 and "flops_profiler" in config_warnings[0], summary["warnings"]
    received = json.loads((run_dir / "config.official.json").read_text())
    assert received["flops_profiler"]["enabled"] is True and received["zero_optimization"]["round_robin_gradients"]
    rank0 = (run_dir / "logs" / "rank0.stdout.log").read_text()
    assert "Flops Profiler" in rank0 or "flops profiler" in rank0.lower(), "official ran its profiler: the key arrived"


def test_the_part_nano_checks_is_the_config_less_exactly_the_official_only_keys():
    from zero_lab.nano.config import official_only_keys, without_official_only_keys

    config = {"train_micro_batch_size_per_gpu": 2, "wandb": {"enabled": False}, "bf16": {"enabled": True,
              "bf16_optimizer_states": True}, "zero_optimization": {"stage": 1, "legacy_stage1": False}}
    assert official_only_keys(config) == ["wandb", "bf16.bf16_optimizer_states", "zero_optimization.legacy_stage1"]
    assert without_official_only_keys(config) == {"train_micro_batch_size_per_gpu": 2, "bf16": {"enabled": True},
                                                  "zero_optimization": {"stage": 1}}
    assert "wandb" in config, "the config itself is left as it was"
