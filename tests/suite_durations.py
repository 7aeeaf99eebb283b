"""The suite's measured test time per file, which `make test`'s longest-first order follows
(tests/conftest.py): read from a JUnit XML report of a whole run, written to tests/suite_durations.json.

    .venv/bin/python -m tests.suite_durations JUNIT.xml     # after `PYTEST_ADDOPTS=--junitxml=JUNIT.xml make test`

Phase 1: sum each file's test seconds (its testcases' `time`, setup and teardown included).
Phase 2: keep the files of 10 seconds or more, longest first, with their seconds rounded.
"""

from __future__ import annotations

import collections
import json
import sys
import xml.etree.ElementTree as ElementTree
from pathlib import Path

DURATIONS = Path(__file__).resolve().with_name("suite_durations.json")
SHORTEST_KEPT_S = 10


def file_seconds(junit: Path) -> dict[str, float]:
    """Phase 1: {tests/.../test_x.py: seconds}."""
    seconds: dict[str, float] = collections.Counter()
    for case in ElementTree.parse(junit).iter("testcase"):
        module = case.get("classname", "").split(".")
        while module and not module[-1].startswith("test_"):  # a class inside the module
            module.pop()
        if module:
            seconds["/".join(module) + ".py"] += float(case.get("time", 0))
    return dict(seconds)


def longest_first(seconds: dict[str, float]) -> dict[str, int]:
    """Phase 2."""
    kept = sorted(((round(time), path) for path, time in seconds.items() if time >= SHORTEST_KEPT_S), reverse=True)
    return {path: time for time, path in kept}


def load() -> list[str]:
    """The files, longest first (what conftest orders by)."""
    return list(json.loads(DURATIONS.read_text()))


if __name__ == "__main__":
    DURATIONS.write_text(json.dumps(longest_first(file_seconds(Path(sys.argv[1]))), indent=1) + "\n")
