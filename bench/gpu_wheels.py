"""The wheels `make gpu-check` carries to a GPU machine without a network, and what it installs
there (bench/gpu_check.py's Phases 1 and 2).

Phase 1 (`wheel_build_commands`, here where pip reaches PyPI): official DeepSpeed's pure-Python
         wheel built from its sdist, and the wheels of its and zero-lab's other needs downloaded,
         each at the version installed here, for the GPU machine's Python.
Phase 2 (there): `missing_modules` its Python cannot import; `wheels_to_install`, the carried
         wheels of those distributions alone; `install_command`, pip offline into `.gpu-site/`.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
WHEEL_DIR = REPO / ".whl"
SITE_DIR = REPO / ".gpu-site"
# Module -> distribution, for what a GPU machine with torch, transformers, typer, rich, pandas,
# matplotlib and psutil still lacks (KINDS.md lists what the nvidia-h200 image holds).
NEEDED = {"deepspeed": "deepspeed", "pydantic": "pydantic", "pydantic_core": "pydantic-core", "hjson": "hjson",
          "annotated_types": "annotated-types", "typing_inspection": "typing-inspection",
          "pytest": "pytest", "pluggy": "pluggy", "iniconfig": "iniconfig"}
# Installed only where the machine's is older: pydantic needs a newer one than some images hold.
ALSO_CARRIED = ("typing-extensions",)
SOURCE_BUILT = ("deepspeed",)  # published as an sdist only; its wheel is pure Python


def wheel_build_commands(python: str, python_version: str, versions: dict[str, str], wheel_dir: Path) -> list[list[str]]:
    """Phase 1: pip commands that fill wheel_dir with every carried distribution at `versions`."""
    pins = [f"{name}=={versions[name]}" for name in (*NEEDED.values(), *ALSO_CARRIED)]
    built = [pin for pin in pins if pin.split("==")[0] in SOURCE_BUILT]
    downloaded = [pin for pin in pins if pin.split("==")[0] not in SOURCE_BUILT]
    return [
        [python, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(wheel_dir), *built],
        [python, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "--python-version", python_version,
         "--implementation", "cp", "--platform", "manylinux_2_17_x86_64", "--platform", "manylinux2014_x86_64",
         "-d", str(wheel_dir), *downloaded],
    ]


def missing_modules(find_spec=importlib.util.find_spec) -> list[str]:
    """Phase 2: the needed modules this Python cannot import."""
    return [module for module in NEEDED if find_spec(module) is None]


def wheel_name(wheel: Path) -> tuple[str, str]:
    """(distribution, version) of a wheel file, the distribution spelled as NEEDED spells it."""
    name, version = wheel.name.split("-")[:2]
    return name.lower().replace("_", "-"), version


def version_key(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", version)[:3])


def installed_version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def wheels_to_install(missing: list[str], wheels: list[Path], installed=installed_version) -> list[Path]:
    """Phase 2: the carried wheels of the missing modules' distributions, and of ALSO_CARRIED where
    the machine's is absent or older; never one the machine has (it would shadow the machine's)."""
    wanted = {NEEDED[module] for module in missing}
    chosen = []
    for wheel in wheels:
        name, version = wheel_name(wheel)
        have = installed(name) if name in ALSO_CARRIED else None
        if name in wanted or (name in ALSO_CARRIED and wanted and (have is None or version_key(have) < version_key(version))):
            chosen.append(wheel)
    return chosen


def install_command(python: str, wheels: list[Path], site_dir: Path) -> list[str]:
    """Phase 2: install the chosen wheels offline into site_dir (one version of each)."""
    return [python, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile", "--no-cache-dir",
            "--upgrade", "--target", str(site_dir), *[str(wheel) for wheel in wheels]]


def check_wheels(missing: list[str], wheels: list[Path]) -> str | None:
    """The problem when wheels for the missing modules are not carried (None when they are)."""
    names = {wheel_name(wheel)[0] for wheel in wheels}
    lacking = [NEEDED[module] for module in missing if NEEDED[module] not in names]
    if not lacking:
        return None
    return (f"this Python lacks {', '.join(lacking)} and {WHEEL_DIR.name}/ has no wheel for it. "
            f"Run `make gpu-wheels` where pip reaches PyPI and carry {WHEEL_DIR.name}/ with the tree")
