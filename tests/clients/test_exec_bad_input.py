"""Bad input to `zero-lab exec` and `zero-lab compare --script`: one line, exit 2, nothing started."""

import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from zero_lab.cli.app import app
from zero_lab.launch.engine_switch import DROPIN_DIR, LOG_CONTRACT, SITE_DIR, impl_environment

runner = CliRunner()
SCRIPT = str(Path(__file__).resolve().parent / "tiny_deepspeed_script.py")


def one_line_error(result) -> str:
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0]


@pytest.mark.parametrize("arguments, words", [
    (["exec", "--impl", "nano"], "needs a command after `--`"),
    (["exec", "--impl", "nano", "--"], "needs a command after `--`"),
    (["exec", "--impl", "megatron", "--", "python", "x.py"], "--impl megatron is not one of nano, official"),
    (["exec", "--device", "tpu", "--", "python", "x.py"], "--device tpu is not one of auto, cpu, cuda"),
    (["exec", "--impl", "nano", "--", "no-such-command-zl", "x.py"], "command 'no-such-command-zl' not found"),
    (["compare", "--device", "cpu", "--script", "missing.py"], "--script missing.py is not a file"),
    (["compare", "--device", "cpu", "--script", SCRIPT, "--steps", "5"], "--steps does not apply with --script"),
    (["compare", "--device", "cpu", "--script", SCRIPT, "--model", "tiny"], "--model does not apply with --script"),
    (["compare", "--device", "cpu", "--script", SCRIPT, "--", "--deepspeed_config", "x.json"],
     "hold --deepspeed_config, which zero-lab appends"),
    (["compare", "--device", "cpu", "--script", SCRIPT, "--resume-check"], "--resume-check need the built-in"),
    (["compare", "--device", "cpu", "--script", SCRIPT, "--impls", "nano,megatron"], "unknown impl 'megatron'"),
])
def test_bad_input_is_one_line_and_exit_2(arguments, words, monkeypatch):
    from zero_lab.launch import torchrun_job

    def no_launch(*args, **kwargs):
        raise AssertionError("bad input started a process")

    monkeypatch.setattr(torchrun_job.subprocess, "Popen", no_launch)
    monkeypatch.setattr(os, "execvpe", no_launch)
    assert words in one_line_error(runner.invoke(app, arguments))


def test_nano_finds_the_dropin_first_and_official_never():
    base = {"PYTHONPATH": os.pathsep.join([str(DROPIN_DIR), "/mine"]), LOG_CONTRACT: "1"}
    nano = impl_environment(base, "nano", "cpu", log_contract=False)
    assert nano["PYTHONPATH"].split(os.pathsep) == [str(SITE_DIR), str(DROPIN_DIR), "/mine"]
    assert nano["DS_ACCELERATOR"] == "cpu" and LOG_CONTRACT not in nano
    official = impl_environment(base, "official", "cuda", log_contract=True)
    assert official["PYTHONPATH"].split(os.pathsep) == [str(SITE_DIR), "/mine"]
    assert official["DS_ACCELERATOR"] == "cuda" and official[LOG_CONTRACT] == "1"
