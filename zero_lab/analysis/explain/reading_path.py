"""The reading path of a ZeRO stage: what a learner reads to understand `zero_lab/nano/stage<N>.py`.

Phase 1 (imports): each module's `zero_lab.nano` imports, read from its source wherever they stand
         (a function's body too): an imported name that is a module counts as that module, and a
         module of a sub-package brings the sub-package's `__init__.py`, which Python runs first.
Phase 2 (closure): from stage<N>.py, every module reached inside zero_lab/nano, counted in lines
         (docstrings included). zero_lab/nano/__init__.py, the vocabulary every reader starts with,
         is left out. The typed config is a room of its own (`config/`): its `__init__.py` is on
         the path, the schema it hands out on first use is read once, at `initialize`.
Phase 3 (order): the package's layer order (zero_lab/nano/__init__.py), so each module comes after
         the modules it imports.
Pure: reads the package's files, imports no torch. `zero-lab explain --stage N --reading-path`
prints it; docs/nano.md "Reading path" tabulates stages 0-3 (`reading_paths_table`).
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

import zero_lab.nano

NANO = Path(zero_lab.nano.__file__).parent
PACKAGE = "zero_lab.nano"
STAGES = (0, 1, 2, 3)


def file_of(dotted: str) -> Path | None:
    """`zero_lab.nano.config.keys` -> config/keys.py, a package -> its __init__.py (None: not nano's)."""
    if dotted != PACKAGE and not dotted.startswith(PACKAGE + "."):
        return None
    base = NANO.joinpath(*dotted.split(".")[2:])
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def with_packages(path: Path) -> set[Path]:
    """`path` and the `__init__.py` of every sub-package it lies in (never the package's own)."""
    found, folder = {path}, path.parent
    while folder != NANO:
        found.add(folder / "__init__.py")
        folder = folder.parent
    return found


def imports_of(path: Path) -> set[Path]:
    """Phase 1: the nano files `path` imports."""
    found: set[Path] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            base = file_of(node.module)
            if base is not None:
                found |= {file_of(f"{node.module}.{alias.name}") or base for alias in node.names}
        elif isinstance(node, ast.Import):
            found |= {file_of(alias.name) for alias in node.names} - {None}
    return {package for file in found for package in with_packages(file)} - {NANO / "__init__.py"}


def closure(start: Path) -> set[Path]:
    """Phase 2: `start` and every nano file it reaches."""
    seen, pending = set(), [start]
    while pending:
        path = pending.pop()
        if path not in seen:
            seen.add(path)
            pending.extend(imports_of(path))
    return seen


def layer_name(path: Path) -> str:
    """config/keys.py -> 'config.keys', config/__init__.py -> 'config': the layer list's names."""
    parts = path.relative_to(NANO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def layer_positions() -> dict[str, tuple[int, int]]:
    """Each module's (layer, place in the list) in zero_lab/nano/__init__.py's layer list, where
    each module imports only those of earlier layers."""
    listing = zero_lab.nano.__doc__.split("Layers, each importing only those listed before it:")[1]
    layers = [re.findall(r"[a-z_0-9.]+", layer) for layer in listing.split("(the API")[0].split("->")]
    listed = [(name, position) for position, names in enumerate(layers) for name in names]
    return {name: (position, place) for place, (name, position) in enumerate(listed)}


@dataclass(frozen=True)
class ReadingPath:
    """One stage's path: (file below zero_lab/nano, lines) in reading order."""

    stage: int
    modules: tuple[tuple[str, int], ...]

    @property
    def lines(self) -> int:
        return sum(lines for _, lines in self.modules)

    def to_json(self) -> dict:
        return {"stage": self.stage, "modules": [{"module": name, "lines": lines} for name, lines in self.modules],
                "module_count": len(self.modules), "lines": self.lines}


def reading_path(stage: int) -> ReadingPath:
    """Phases 1-3 for stage<N>.py."""
    positions = layer_positions()
    ordered = sorted(closure(NANO / f"stage{stage}.py"), key=lambda path: positions[layer_name(path)])
    return ReadingPath(stage, tuple((path.relative_to(NANO).as_posix(), len(path.read_text(encoding="utf-8").splitlines()))
                                    for path in ordered))


def title(path: ReadingPath) -> str:
    return (f"Reading path of stage {path.stage}: zero_lab/nano/stage{path.stage}.py and what it imports inside "
            f"zero_lab/nano, each module after those it imports: {len(path.modules)} modules, {path.lines:,} lines "
            "(docstrings included). Start with zero_lab/nano/__init__.py, the vocabulary (not counted); "
            "config/'s schema is read at initialize.")


def path_table(path: ReadingPath) -> tuple[list[str], list[list[str]]]:
    """(headers, rows) of one stage's path, in reading order, and its total."""
    rows = [[f"{number}. {name}", f"{lines:,}"] for number, (name, lines) in enumerate(path.modules, start=1)]
    return ["module", "lines"], rows + [[f"{len(path.modules)} modules", f"{path.lines:,}"]]


def reading_paths_table(stages: tuple[int, ...] = STAGES) -> tuple[list[str], list[list[str]]]:
    """(headers, rows) of every stage's path at once (docs/nano.md "Reading path"): each module once,
    in reading order, marked in the column of each stage whose path holds it."""
    paths = [reading_path(stage) for stage in stages]
    positions = layer_positions()
    lines_of = {name: lines for path in paths for name, lines in path.modules}
    ordered = sorted(lines_of, key=lambda name: positions[layer_name(NANO / name)])
    rows = [[f"`{name}`", f"{lines_of[name]:,}", *["x" if name in dict(path.modules) else "" for path in paths]]
            for name in ordered]
    rows.append(["modules", "", *[str(len(path.modules)) for path in paths]])
    rows.append(["lines", "", *[f"{path.lines:,}" for path in paths]])
    return ["module", "lines", *[f"stage {stage}" for stage in stages]], rows
