"""Which packages a run used at other versions than the lock that `make setup` installs.

The lock is constraints.txt at the repository's root: pip's constraints file, one `name==version`
a line, written by `make lock` from the versions the suite last passed with. A run records the
versions it used in its environment (env.json, the report's "Environment" table); a report
compares the two, so a figure measured on other versions says so.

Phase 1 (read): the lock's pins, names normalised as pip compares them (case, `-`/`_`/`.`).
Phase 2 (compare): each package the run recorded and the lock pins, whose versions differ once a
         local build label (torch's `+cpu`, `+cu130`) is set aside, as pip's `==` sets it aside.
"""

from __future__ import annotations

import re
from pathlib import Path

LOCK_PATH = Path(__file__).resolve().parents[3] / "constraints.txt"
# The environment's keys that are not packages (`zero_lab.cli.environment.environment`).
NOT_PACKAGES = ("python", "platform", "device", "cpu", "cpu_cores", "gpus")


def normalised(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def locked_versions(path: Path | None = None) -> dict[str, str]:
    """Phase 1: {normalised name: version} from `path` (the checkout's LOCK_PATH); empty where there
    is no lock (an installed wheel, not a checkout)."""
    try:
        lines = (path or LOCK_PATH).read_text(encoding="utf-8").splitlines()
    except OSError:
        return {}
    pins = {}
    for line in lines:
        name, separator, version = line.split("#", 1)[0].strip().partition("==")
        if separator and name and version:
            pins[normalised(name)] = version.strip()
    return pins


def differences_from_lock(environment: dict, lock: dict[str, str] | None = None) -> list[tuple[str, str, str]]:
    """Phase 2: (package, version the run used, version locked) for each package that differs."""
    lock = locked_versions() if lock is None else lock
    differences = []
    for key, used in environment.items():
        locked = lock.get(normalised(key))
        if key in NOT_PACKAGES or locked is None or not used:
            continue
        if str(used).split("+", 1)[0] != locked.split("+", 1)[0]:
            differences.append((key, str(used), locked))
    return differences


def lock_note(environment: dict, lock: dict[str, str] | None = None) -> str:
    """One sentence for a report: which versions differ from the lock, or nothing when none does."""
    differences = differences_from_lock(environment, lock)
    if not differences:
        return ""
    listed = ", ".join(f"{package} {used} (lock {locked})" for package, used, locked in differences)
    return (f"These versions differ from the lock (constraints.txt, what `make setup` installs): {listed}; "
            "figures measured on other versions may not match the committed ones.")
