"""Suite-wide: a Python without zero-lab's dependencies stops the run before collection with one
line saying what to do (a bare GPU machine: `make gpu-check` installs them first), instead of an
ImportError per test module; a test that leaves a storage tracker's resize hook installed fails
itself, instead of failing whichever memory test happens to run after it; tests marked `gpu` are
skipped where torch sees no CUDA device (`pytest -m gpu tests/gpu` runs them on a GPU machine, as
`make gpu-check` does), unless rehearsed on CPU (tests/gpu/__init__.py); under pytest-xdist (`make
test`: two workers, one file at a time each) the longest files start first; a run of the whole suite
ends with its duration beside the README's figure for `make test`.
"""
import importlib.util
import os
import re
import time
from pathlib import Path

import pytest
import torch

from tests.gpu import REHEARSAL_ENVIRONMENT
from tests import suite_durations

# What the test modules import beside torch and pytest (pyproject's dependencies that a GPU
# machine's image may lack: bench/gpu_check.py carries them).
DEPENDENCIES = ("pydantic", "deepspeed", "hjson", "transformers")


def missing_dependencies(find_spec=importlib.util.find_spec) -> list[str]:
    return [name for name in DEPENDENCIES if find_spec(name) is None]


def pytest_configure(config):
    missing = missing_dependencies()
    if missing:
        raise pytest.UsageError(
            f"this Python lacks {', '.join(missing)}, which zero-lab's tests import. Install zero-lab's dependencies "
            "(make setup), or on a GPU machine run `make gpu-check` (only the GPU tests: python3 bench/gpu_check.py "
            "--only gpu-tests), which installs them from the wheels in .whl/ first")

README = Path(__file__).resolve().parents[1] / "README.md"
# How the README states make test's duration (tests/docs/test_install_truth.py holds both READMEs to it).
STATED_DURATION = re.compile(r"`-n 2 --dist loadfile`\), (\d+) to (\d+) minutes on 2 cores")


@pytest.fixture(autouse=True)
def no_tracker_left_installed():
    before = torch.UntypedStorage.resize_
    yield
    leaked = torch.UntypedStorage.resize_ is not before
    torch.UntypedStorage.resize_ = before
    assert not leaked, "this test left a LiveStorageTracker entered (its resize_ hook is still installed)"


# The files that take longest, longest first, as the last measured run found them (tests/suite_durations.json,
# written by `python -m tests.suite_durations JUNIT.xml` from a whole run's JUnit report). Under xdist a worker
# takes whole files in collection order; a long file taken last would run alone while the other worker idles,
# so these go first, then the other slow or official files, then the in-process ones, which fill the gaps.
# Order only: every test runs, as it would alone.
LONGEST_FIRST = suite_durations.load()


def longest_first(items: list[pytest.Item]) -> list[pytest.Item]:
    """items, whole files moved (a file's tests keep their order): LONGEST_FIRST, then files with a
    slow or official test, then the rest, each group in collection order."""
    rank: dict[str, tuple[int, int]] = {}
    for item in items:
        path = item.nodeid.split("::")[0]
        heavy = "slow" in item.keywords or "official" in item.keywords
        group = (0, LONGEST_FIRST.index(path)) if path in LONGEST_FIRST else (1 if heavy else 2, 0)
        rank[path] = min(rank.get(path, group), group)
    return sorted(items, key=lambda item: rank[item.nodeid.split("::")[0]])  # stable


def pytest_collection_modifyitems(config, items):
    if hasattr(config, "workerinput"):  # a pytest-xdist worker; every worker sorts alike
        items[:] = longest_first(items)
    if torch.cuda.is_available() or os.environ.get(REHEARSAL_ENVIRONMENT) == "1":  # tests/gpu/__init__.py
        return
    no_gpu = pytest.mark.skip(reason="needs a CUDA GPU (run `pytest -m gpu tests/gpu` or `make gpu-check` on one)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(no_gpu)


def pytest_sessionstart(session):
    session.config.suite_started = time.monotonic()


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """After the whole suite ran (no -m, -k, --co or paths given), `make test`'s duration here beside the
    README's figure: a CI log shows when the figure no longer holds."""
    if hasattr(config, "workerinput") or config.option.markexpr or config.option.keyword or config.option.collectonly:
        return
    if [(config.invocation_params.dir / argument).resolve() for argument in config.args] != [README.parent / "tests"]:
        return
    minutes = (time.monotonic() - config.suite_started) / 60
    stated = STATED_DURATION.search(" ".join(README.read_text(encoding="utf-8").split()))
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    said = f"{stated[1]} to {stated[2]}" if stated else "?"
    terminalreporter.write_line(f"the whole suite took {minutes:.1f} minutes on {cores} cores (load average "
                                f"{os.getloadavg()[0]:.1f}); README.md says {said} minutes on 2 cores")
