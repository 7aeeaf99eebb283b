"""What `make setup` downloads for torch, for each of the Makefile's choices (TORCH=cpu, TORCH=cuda):
the wheels pip resolves and each one's size. Needs the network (PyPI); nothing is installed.

    python bench/torch_download.py    # prints the totals and writes bench/torch_download.json

Phase 1: the Makefile's TORCH_VERSION and TORCH_CPU_INDEX (one source of truth).
Phase 2: each choice resolved as `make setup` installs it, by `pip install --dry-run --ignore-installed
         --report` (metadata only; every wheel of the install listed, installed or not):
           cpu:  torch==VERSION+cpu from pip's own sources, else also PyTorch's CPU index;
           cuda: torch==VERSION from PyPI alone, pip's local settings left out (a stock machine's view).
Phase 3: each wheel's size: a local file's own, else the Content-Length its index serves (HEAD).
Phase 4: {choice: {"requirement", "platform", "bytes", "wheels": [{"name", "version", "bytes"}]}}
         written beside this file; the README's set-up figures are held to it
         (tests/docs/test_install_truth.py).
"""

from __future__ import annotations

import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path
from urllib.parse import unquote, urlparse

REPO = Path(__file__).resolve().parents[1]
RECORD = Path(__file__).with_suffix(".json")
PYPI = "https://pypi.org/simple"


def makefile_value(name: str) -> str:
    """Phase 1: `NAME := value` of the Makefile."""
    return re.search(rf"^{name} := (\S+)", (REPO / "Makefile").read_text(), flags=re.M)[1]


def resolve(requirement: str, pip_options: list[str], isolated: bool) -> list[dict] | None:
    """Phase 2: pip's report of what installing `requirement` would fetch; None when pip finds no match."""
    environment = {**os.environ, **({"PIP_CONFIG_FILE": os.devnull, "PIP_FIND_LINKS": ""} if isolated else {})}
    with tempfile.TemporaryDirectory() as scratch:
        report = Path(scratch) / "report.json"
        done = subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "-q",
                               *(["--isolated"] if isolated else []), "--report", str(report), *pip_options,
                               requirement], env=environment, capture_output=True, text=True)
        if done.returncode != 0:
            return None
        return json.loads(report.read_text())["install"]


def size_of(url: str) -> int:
    """Phase 3: a wheel's bytes."""
    if url.startswith("file:"):
        return Path(unquote(urlparse(url).path)).stat().st_size
    with urllib.request.urlopen(urllib.request.Request(url, method="HEAD"), timeout=120) as answer:
        return int(answer.headers["Content-Length"])


def record(installs: list[dict], requirement: str) -> dict:
    wheels = sorted(({"name": item["metadata"]["name"], "version": item["metadata"]["version"],
                      "bytes": size_of(item["download_info"]["url"])} for item in installs),
                    key=lambda wheel: -wheel["bytes"])
    return {"requirement": requirement, "platform": f"{platform.system()} {platform.machine()}, "
            f"CPython {platform.python_version()}", "bytes": sum(wheel["bytes"] for wheel in wheels), "wheels": wheels}


def main() -> int:
    version, cpu_index = makefile_value("TORCH_VERSION"), makefile_value("TORCH_CPU_INDEX")
    cpu = f"torch=={version}+cpu"
    found = resolve(cpu, [], isolated=False) or resolve(cpu, ["--extra-index-url", cpu_index], isolated=False)
    cuda = f"torch=={version}"
    resolved = {"cpu": (cpu, found), "cuda": (cuda, resolve(cuda, ["--index-url", PYPI], isolated=True))}
    missing = [choice for choice, (_, installs) in resolved.items() if installs is None]
    if missing:
        print(f"error: pip found no install for TORCH={', '.join(missing)}; check the network", file=sys.stderr)
        return 1
    figures = {choice: record(installs, requirement) for choice, (requirement, installs) in resolved.items()}
    RECORD.write_text(json.dumps(figures, indent=1) + "\n")
    for choice, figure in figures.items():
        nvidia = [wheel for wheel in figure["wheels"] if wheel["name"].startswith("nvidia-")]
        print(f"TORCH={choice}: {figure['requirement']}, {len(figure['wheels'])} wheels, {figure['bytes'] / 1e6:,.0f} MB "
              f"({len(nvidia)} nvidia-* wheels, {sum(wheel['bytes'] for wheel in nvidia) / 1e6:,.0f} MB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
