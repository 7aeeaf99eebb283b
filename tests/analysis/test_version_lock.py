"""The lock (constraints.txt) pins what the project depends on, `make setup` installs from it, and a
report says which of a run's versions differ from it."""

import re
import tomllib
from pathlib import Path

from zero_lab.analysis.report import version_lock
from zero_lab.analysis.report.markdown import environment_section

ROOT = Path(__file__).resolve().parents[2]


def requirement_names() -> list[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    requirements = project["dependencies"] + project["optional-dependencies"]["dev"]
    return [version_lock.normalised(re.split(r"[<>=!~\[ ;]", requirement, maxsplit=1)[0]) for requirement in requirements]


def test_the_lock_pins_every_dependency_and_dev_tool_the_project_names():
    pinned = version_lock.locked_versions()
    assert pinned, f"{version_lock.LOCK_PATH} is missing or pins nothing: run `make lock`"
    assert [name for name in requirement_names() if name not in pinned] == []
    assert "+" not in pinned["torch"]  # one lock for the CPU and CUDA builds: pip's == ignores the label


def test_make_setup_installs_every_package_through_the_lock():
    makefile = (ROOT / "Makefile").read_text()
    assert "CONSTRAIN ?= -c $(LOCK)" in makefile and "LOCK := constraints.txt" in makefile
    installs = [line for line in makefile.splitlines() if "pip install" in line and "--upgrade pip" not in line
                and "--no-deps" not in line and line.strip().startswith(("TORCH_INSTALL", "$(BIN)", "||"))]
    assert installs and all("$(CONSTRAIN)" in line for line in installs), installs


def test_a_report_names_each_version_that_differs_from_the_lock(tmp_path, monkeypatch):
    lock = tmp_path / "constraints.txt"
    lock.write_text("# a comment\ntorch==2.13.0\nTransformers==5.25.0\nnumpy==2.4.6\n")
    monkeypatch.setattr(version_lock, "LOCK_PATH", lock)
    environment = {"python": "3.11.7", "torch": "2.13.0+cpu", "transformers": "5.24.0", "numpy": "2.4.6",
                   "zero-lab": "0.1.0", "device": "cpu"}
    assert version_lock.differences_from_lock(environment) == [("transformers", "5.24.0", "5.25.0")]
    section = environment_section(environment)
    assert "differ from the lock" in section and "transformers 5.24.0 (lock 5.25.0)" in section
    assert "torch" not in section.split("differ from the lock")[1]  # +cpu is a build label, not a version
    assert "differ from the lock" not in environment_section({**environment, "transformers": "5.25.0"})


def test_without_a_lock_nothing_is_said(tmp_path, monkeypatch):
    monkeypatch.setattr(version_lock, "LOCK_PATH", tmp_path / "absent.txt")
    assert version_lock.differences_from_lock({"torch": "1.0"}) == []
