"""The launcher asks for no port in advance: torchrun's agent binds port 0 and the ranks join its store."""

import subprocess
import sys

import pytest

from zero_lab.cli import jobs
from zero_lab.cli.environment import environment
from zero_lab.launch import torchrun, torchrun_job


def test_the_agent_binds_the_port_the_os_gives_it_and_the_ranks_join_its_store(tmp_path, monkeypatch):
    shared = jobs.SharedSettings(None, "cpu", torchrun.Workload(model="tiny", steps=1), torchrun.MultiNode(), [])
    job = jobs.prepare(shared, "nano", 1, 1, tmp_path / "run")
    env = environment("cpu")  # before the patch: platform may start `uname`
    real_popen = subprocess.Popen
    launched = []

    def record_and_run_nothing(command, **kwargs):
        launched.append((command, kwargs["env"]))
        return real_popen([sys.executable, "-c", ""], **kwargs)

    monkeypatch.setattr(torchrun_job.subprocess, "Popen", record_and_run_nothing)
    torchrun_job.execute(job.spec, job.run_dir, job.config, None, env, job.label)
    [(command, child_env)] = launched
    assert command[command.index("--rdzv-endpoint") + 1] == "127.0.0.1:0" and "--master-port" not in command
    assert child_env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] == "0", "the ranks join the store the agent bound"
    assert "--rdzv-endpoint 127.0.0.1:0" in (tmp_path / "run" / "command.txt").read_text()


def test_a_stop_signal_before_torchrun_starts_ends_the_run_with_its_exit_code(tmp_path, monkeypatch):
    import signal

    from typer.testing import CliRunner

    from zero_lab import signals
    from zero_lab.cli.app import app

    def sigterm_now(spec):
        raise signals.Stopped(signal.SIGTERM)  # what the handler raises in the main thread

    monkeypatch.setattr(torchrun, "torchrun_command", sigterm_now)  # the last step before torchrun starts
    monkeypatch.setattr(torchrun_job.subprocess, "Popen", lambda *args, **kwargs: pytest.fail("torchrun started"))
    result = CliRunner().invoke(app, ["run", "--device", "cpu", "--model", "tiny", "--out", str(tmp_path)])
    assert result.exit_code == 143 and "Traceback" not in result.output, result.output
    assert not any(tmp_path.iterdir()), "nothing launched, nothing left: the claimed run directory is gone"
