"""The CLI answers at once: importing the app loads none of the heavy libraries; each command
imports what it needs where it uses it. `--help`, `explain` and `estimate` never load pandas or
matplotlib (only `parse`, `report` and `compare` build tables), and `import zero_lab` does not either:
its DataFrame API loads pandas when first used."""

import subprocess
import sys

import pytest

HEAVY = ("torch", "transformers", "deepspeed", "pandas", "matplotlib")
TABLES = ("pandas", "matplotlib")

# Run the CLI in-process, then name the heavy modules it left loaded.
RUN_CLI = f"""
import sys
sys.argv = ["zero-lab", *sys.argv[1:]]
from zero_lab.cli.app import main
try:
    main()
except SystemExit as done:
    assert not done.code, f"exit code {{done.code}}"
print(sorted(m for m in {HEAVY!r} if m in sys.modules), file=sys.stderr)
"""


def loaded_by(script: str, *arguments: str) -> list[str]:
    done = subprocess.run([sys.executable, "-c", script, *arguments], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return eval(done.stderr.strip().splitlines()[-1])


def test_the_cli_app_imports_no_heavy_module():
    script = f"import sys, zero_lab.cli.app; print(sorted(m for m in {HEAVY!r} if m in sys.modules), file=sys.stderr)"
    assert loaded_by(script) == []


def test_import_zero_lab_loads_no_pandas_until_its_api_is_used():
    script = ("import sys, zero_lab; before = 'pandas' in sys.modules; zero_lab.load_steps; "
              "print(['before'] * before + ['after'] * ('pandas' in sys.modules), file=sys.stderr)")
    assert loaded_by(script) == ["after"]


@pytest.mark.parametrize("arguments", [["--help"], ["explain"], ["explain", "--stage", "3"]])
def test_help_and_explain_load_no_heavy_module(arguments):
    assert loaded_by(RUN_CLI, *arguments) == []


@pytest.mark.parametrize("arguments", [["estimate", "--model", "tiny"],
                                       ["estimate", "--model", "qwen3-0.6b", "--gpus", "8", "--stages", "1,2,3"]])
def test_estimate_with_a_preset_loads_no_pandas_or_matplotlib(arguments):
    assert not set(loaded_by(RUN_CLI, *arguments)) & set(TABLES)
