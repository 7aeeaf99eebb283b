"""The launcher picks each run's port just before it starts torchrun, not when the run is prepared."""

import subprocess
import sys

import pytest

from zero_lab.cli import jobs
from zero_lab.cli.environment import environment
from zero_lab.launch import ports, torchrun, torchrun_job


def test_the_port_is_picked_at_launch_time_not_at_prepare_time(tmp_path, monkeypatch):
    events = []
    monkeypatch.setattr(ports, "free_port", lambda: events.append("free_port") or 29777)
    shared = jobs.SharedSettings(None, "cpu", torchrun.Workload(model="tiny", steps=1), torchrun.MultiNode(), [])
    job = jobs.prepare(shared, "nano", 1, 1, tmp_path / "run")
    assert job.spec.port is None and events == [], "preparing a run reserves no port"

    env = environment("cpu")  # before the patch: platform may start `uname`
    real_popen = subprocess.Popen

    def record_and_run_nothing(command, **kwargs):
        events.append(command[command.index("--master-port") + 1])
        return real_popen([sys.executable, "-c", ""], **kwargs)

    monkeypatch.setattr(torchrun_job.subprocess, "Popen", record_and_run_nothing)
    torchrun_job.execute(job.spec, job.run_dir, job.config, None, env, job.label)
    assert events == ["free_port", "29777"], "the port is asked for, then torchrun starts with it"
    assert "--master-port 29777" in (tmp_path / "run" / "command.txt").read_text()


def test_a_stop_signal_before_torchrun_starts_ends_the_run_with_its_exit_code(tmp_path, monkeypatch):
    import signal

    from typer.testing import CliRunner

    from zero_lab import signals
    from zero_lab.cli.app import app

    def sigterm_now():
        raise signals.Stopped(signal.SIGTERM)  # what the handler raises in the main thread

    monkeypatch.setattr(ports, "free_port", sigterm_now)  # the last step before torchrun starts
    monkeypatch.setattr(torchrun_job.subprocess, "Popen", lambda *args, **kwargs: pytest.fail("torchrun started"))
    result = CliRunner().invoke(app, ["run", "--device", "cpu", "--model", "tiny", "--out", str(tmp_path)])
    assert result.exit_code == 143 and "Traceback" not in result.output, result.output
    assert not any(tmp_path.iterdir()), "nothing launched, nothing left: the claimed run directory is gone"
