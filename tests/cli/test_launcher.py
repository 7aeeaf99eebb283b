"""The launcher picks each run's port just before it starts torchrun, not when the run is prepared."""

import subprocess
import sys

from zero_lab.analysis import launch
from zero_lab.cli import jobs, launcher
from zero_lab.cli.environment import environment


def test_the_port_is_picked_at_launch_time_not_at_prepare_time(tmp_path, monkeypatch):
    events = []
    monkeypatch.setattr(launch, "free_port", lambda: events.append("free_port") or 29777)
    shared = jobs.Launch(None, "cpu", launch.Workload(model="tiny", steps=1), launch.MultiNode(), [])
    job = jobs.prepare(shared, "nano", 1, 1, tmp_path / "run")
    assert job.spec.port is None and events == [], "preparing a run reserves no port"

    env = environment("cpu")  # before the patch: platform may start `uname`
    real_popen = subprocess.Popen

    def record_and_run_nothing(command, **kwargs):
        events.append(command[command.index("--master-port") + 1])
        return real_popen([sys.executable, "-c", ""], **kwargs)

    monkeypatch.setattr(launcher.subprocess, "Popen", record_and_run_nothing)
    launcher.execute(job.spec, job.run_dir, job.config, None, env, job.label)
    assert events == ["free_port", "29777"], "the port is asked for, then torchrun starts with it"
    assert "--master-port 29777" in (tmp_path / "run" / "command.txt").read_text()
