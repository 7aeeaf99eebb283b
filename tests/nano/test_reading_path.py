"""A stage's reading path (issue 40): what `stage<N>.py` imports inside zero_lab/nano, directly or not,
holds only that stage and the ones before it, and stays under the issue's bounds.

The closure here is the test's own, from `test_layers.nano_imports` (the layer test's reading of every
import, a function's body included), checked in turn against what Python really loads when a stage
is imported; `zero-lab explain --reading-path` and docs/nano.md's "Reading path" are held to it.
Counted as the issue counts: lines of the modules, docstrings included, zero_lab/nano/__init__.py
(the vocabulary) left out.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from tests.docs.doc_text import REPO, read, table_after
from tests.nano.test_layers import PACKAGE, is_module, module_name, nano_imports

BOUNDS = {0: 1500, 2: 1900, 3: 2700}  # the issue's: lines of stage N's path
ROOMS = ("offload", "init", "zeropp", "checkpoint", "muon")  # off-path rooms: what the engine facade hands over
# What stages 0-2 never read: memory accounting, and stage 3's modules (its policies among them).
NOT_BELOW_STAGE_3 = {"memory_formula", "optimizer_memory", "stage3", "stage3_units", "unit_policy", "fetch_policy",
                     "fetch_trace", "sharded_flat_buffer", "unit_gathering", "coalesced_gather", "external_parameters",
                     "persistent_reduction", "spanning_layout"}
# What no stage reads: the policies `initialize` hands to stage 3 (units, fetch rules) and the accounting.
NOT_ON_ANY_PATH = {"memory_formula", "optimizer_memory", "stage3_units", "unit_policy", "fetch_policy"}


def path_of(name: str):
    path = PACKAGE.joinpath(*name.split("."))
    return path.with_suffix(".py") if path.with_suffix(".py").is_file() else path / "__init__.py"


def with_packages(name: str) -> set[str]:
    """A module and the sub-packages it lies in (Python runs their __init__ first)."""
    parts = name.split(".")
    return {".".join(parts[:end]) for end in range(1, len(parts) + 1)}


def closure(stage: int) -> set[str]:
    seen, pending = set(), [f"stage{stage}"]
    while pending:
        name = pending.pop()
        if name not in seen:
            seen.add(name)
            pending += [package for imported in nano_imports(path_of(name)) for package in with_packages(imported)]
    return seen - {""}


def lines(names: set[str]) -> int:
    return sum(len(path_of(name).read_text().splitlines()) for name in names)


def test_every_nano_import_is_one_the_closure_reads():
    """The closure reads `from zero_lab.nano... import`; nano imports its own modules no other way."""
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            assert not (isinstance(node, ast.ImportFrom) and node.level), f"{path}: a relative import"
            assert not (isinstance(node, ast.Import) and any(alias.name.startswith("zero_lab") for alias in node.names)), \
                f"{path}: `import zero_lab...`"


@pytest.mark.parametrize("stage", sorted(BOUNDS))
def test_each_stage_path_stays_under_the_issues_bound(stage):
    names = closure(stage)
    assert lines(names) < BOUNDS[stage], (f"stage {stage}'s path is {len(names)} modules, {lines(names)} lines "
                                          f"(bound {BOUNDS[stage]}): {sorted(names)}")


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_a_stage_path_holds_no_later_stage_and_no_optional_feature(stage):
    names = closure(stage)
    later = {f"stage{number}" for number in range(stage + 1, 4)} | (NOT_BELOW_STAGE_3 if stage < 3 else set())
    in_rooms = {name for name in names if name.split(".")[0] in ROOMS}
    assert not in_rooms and not names & later and not names & NOT_ON_ANY_PATH, \
        (in_rooms, names & later, names & NOT_ON_ANY_PATH)
    assert all(is_module(name) for name in names)


def test_importing_a_stage_loads_only_its_path_and_the_config_room():
    """Python's own account: each stage imported in a fresh interpreter (0 to 3, each importing the
    one before) loads nothing of nano beyond its path, but the typed config's schema (`config/`,
    which `config/__init__.py` hands out on first use)."""
    script = ("import importlib, json, sys\n"
              "for stage in range(4):\n"
              "    importlib.import_module(f'zero_lab.nano.stage{stage}')\n"
              "    print(json.dumps(sorted(m for m in sys.modules if m.startswith('zero_lab.nano.'))))\n")
    loaded = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True,
                            cwd=REPO, timeout=120).stdout.splitlines()
    for stage, modules in enumerate(loaded):
        beyond = {name.removeprefix("zero_lab.nano.") for name in json.loads(modules)} - closure(stage)
        assert all(name.split(".")[0] == "config" for name in beyond), f"stage {stage} loads {sorted(beyond)}"


def command_path(stage: int) -> dict:
    from zero_lab.cli.app import app

    result = CliRunner().invoke(app, ["explain", "--stage", str(stage), "--reading-path", "--format", "json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_the_command_prints_the_path_in_an_order_that_reads_each_import_first(stage):
    printed = command_path(stage)
    order = [module_name(PACKAGE / entry["module"]) for entry in printed["modules"]]
    assert set(order) == closure(stage) and len(order) == len(set(order)), order
    assert [entry["lines"] for entry in printed["modules"]] == [lines({name}) for name in order]
    assert printed["lines"] == lines(closure(stage)) and printed["module_count"] == len(order)
    for position, name in enumerate(order):
        unread = {imported for imported in nano_imports(path_of(name)) if imported} - set(order[:position])
        assert not unread, f"{name} comes before {unread}, which it imports"


def test_the_docs_reading_path_table_is_the_commands_output():
    rows = table_after(read(REPO / "docs" / "nano.md"), "## Reading path")
    assert rows[0] == ["module", "lines", "stage 0", "stage 1", "stage 2", "stage 3"]
    modules, totals = rows[1:-2], {row[0]: row[2:] for row in rows[-2:]}
    for column, stage in enumerate(range(4)):
        printed = command_path(stage)
        marked = [row[0].strip("`") for row in modules if row[2 + column] == "x"]
        assert marked == [entry["module"] for entry in printed["modules"]], f"stage {stage}: {marked}"
        assert all(row[1] == f"{entry['lines']:,}" for row in modules for entry in printed["modules"]
                   if row[0].strip("`") == entry["module"])
        assert totals["modules"][column] == str(printed["module_count"])
        assert totals["lines"][column] == f"{printed['lines']:,}"
