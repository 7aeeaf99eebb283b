"""`zero-lab lab list|start|check` without a launch: what start writes, and bad input as one line, exit 2."""

import ast

import pytest
from typer.testing import CliRunner

from zero_lab.cli.app import app
from zero_lab.labs.catalog import LABS
from zero_lab.labs.check import check_runs, missing_function

runner = CliRunner()


def test_list_names_every_lab_in_course_order():
    done = runner.invoke(app, ["lab", "list"])
    assert done.exit_code == 0, done.output
    assert [lab.name for lab in LABS] == ["zero1", "zero2", "zero3", "fp16", "offload"]
    positions = [done.output.index(f"{lab.name}: {lab.title}") for lab in LABS]
    assert positions == sorted(positions)


@pytest.mark.parametrize("lab", LABS, ids=[lab.name for lab in LABS])
def test_start_writes_the_skeleton_whose_every_function_to_write_names_the_lab(lab, tmp_path):
    directory = tmp_path / f"lab_{lab.name}"
    done = runner.invoke(app, ["lab", "start", lab.name, str(directory)])
    assert done.exit_code == 0, done.output
    assert sorted(path.name for path in directory.iterdir()) == ["README.md", "__init__.py", "engine.py", "lab.py",
                                                                 "on_nano.py"]
    tree = ast.parse((directory / "lab.py").read_text())
    functions = [node for node in tree.body if isinstance(node, ast.FunctionDef)]
    assert tuple(function.name for function in functions) == lab.functions
    for function in functions:
        assert ast.get_docstring(function), function.name
        raised = ast.unparse(function.body[-1])
        assert raised.startswith(f"raise NotImplementedError('lab {lab.name}: write {function.name} in lab.py"), raised
    readme = (directory / "README.md").read_text()
    assert lab.lesson in readme and lab.formula in readme and f"zero-lab lab check {lab.name} {directory}" in readme
    assert f"--stages {lab.stage}{' ' + lab.compare_options if lab.compare_options else ''} --impls" in readme
    again = runner.invoke(app, ["lab", "start", lab.name, str(directory)])
    assert again.exit_code == 2 and "already holds a lab" in again.output


@pytest.mark.parametrize("argv, problem", [
    (["lab", "start", "zero9"], "error: no lab named 'zero9'. choose from zero1, zero2, zero3, fp16, offload"),
    (["lab", "check", "zero9"], "error: no lab named 'zero9'"),
    (["lab", "check", "zero1", "{tmp}/empty"], "holds no lab package (no lab.py and __init__.py). write one with: "
                                               "zero-lab lab start zero1"),
])
def test_bad_input_is_one_line_and_exit_2(argv, problem, tmp_path):
    (tmp_path / "empty").mkdir()
    done = runner.invoke(app, [arg.format(tmp=tmp_path) for arg in argv])
    assert done.exit_code == 2 and problem in done.output and "Traceback" not in done.output, done.output


def test_a_failed_run_names_the_function_still_to_write():
    lab = LABS[0]
    tail = 'Traceback ...\nNotImplementedError: lab zero1: write reduce_scatter_gradients in lab.py\n'
    assert missing_function(tail, lab) == "reduce_scatter_gradients"
    result = check_runs({"world_size": 2, "status": "failed", "log_tail": tail, "run_dir": "x"}, lab)
    assert not result.ok and result.hint.startswith("write reduce_scatter_gradients in lab.py")
    other = check_runs({"world_size": 3, "status": "failed", "log_tail": "ValueError: boom\n", "run_dir": "x"}, lab)
    assert not other.ok and "ValueError: boom" in other.lines[0]


def test_every_lab_has_six_mutants_and_docs_labs_md_shows_the_table_of_them():
    from pathlib import Path

    from tests.labs.mistakes import MUTANTS, mutants_of

    assert all(len(mutants_of(lab.name)) >= 6 for lab in LABS), {lab.name: len(mutants_of(lab.name)) for lab in LABS}
    assert all(mutant.function in next(lab for lab in LABS if lab.name == mutant.lab).functions for mutant in MUTANTS)
    text = (Path(__file__).resolve().parents[2] / "docs" / "labs.md").read_text()
    section = text.split("## Common mistakes, and what the check says")[1].split("\n## ")[0]
    rows = [[cell.strip().strip("`") for cell in line.strip("|").split("|")] for line in section.splitlines()
            if line.startswith("| ") and not line.startswith("| lab |")]
    assert rows == [[m.lab, m.name, m.mistake, m.caught_by, m.function] for m in MUTANTS]
