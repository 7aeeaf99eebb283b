"""A non-editable install (`pip install .`) runs the harness: its entry and default configs ship
inside the package, so nothing is looked up in a checkout."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # builds the package and launches torchrun

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """zero-lab copied into a fresh folder (no .pth link back to the checkout), first on the path."""
    source, target = tmp_path_factory.mktemp("source"), tmp_path_factory.mktemp("site")
    for name in ("pyproject.toml", "README.md"):  # a copy, so the build's own files stay out of the checkout
        shutil.copy(REPO / name, source / name)
    shutil.copytree(REPO / "zero_lab", source / "zero_lab", ignore=shutil.ignore_patterns("__pycache__"))
    build = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                            "--target", str(target), str(source)], capture_output=True, text=True, timeout=300)
    assert build.returncode == 0, build.stderr[-2000:]
    return target


def run_installed(installed: Path, cwd: Path, code: str, *argv: str) -> subprocess.CompletedProcess:
    environment = {"PATH": str(Path(sys.executable).parent), "PYTHONPATH": str(installed), "HOME": str(cwd)}
    return subprocess.run([sys.executable, "-c", code, *argv], cwd=cwd, env=environment, capture_output=True,
                          text=True, timeout=300)


def test_zero_lab_run_works_from_a_non_editable_install(installed, tmp_path):
    found = run_installed(installed, tmp_path, "import zero_lab.launch.torchrun as t; print(t.TRAIN_SCRIPT)")
    assert Path(found.stdout.strip()).is_relative_to(installed), found.stdout + found.stderr

    run = run_installed(installed, tmp_path, "from zero_lab.cli.entry import main; main()",
                        "run", "--impl", "nano", "--gpus", "1", "--device", "cpu", "--model", "tiny", "--steps", "2",
                        "--stage", "2", "--out", str(tmp_path / "runs"), "--name", "installed")
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    summary = json.loads((tmp_path / "runs" / "installed" / "summary.json").read_text())
    assert summary["steps"] == 2
    assert str(installed) in (tmp_path / "runs" / "installed" / "command.txt").read_text()


def test_python_m_zero_lab_harness_trains_one_process(installed, tmp_path):
    run = run_installed(installed, tmp_path, "import runpy; runpy.run_module('zero_lab.harness', run_name='__main__')",
                        "--impl", "nano", "--model-name", "tiny", "--steps", "1", "--batch-size", "1",
                        "--seq-len", "16", "--device", "cpu")
    assert run.returncode == 0, run.stderr[-3000:]
    assert "[opt_step 1]" in run.stdout
