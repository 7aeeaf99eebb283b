"""Lab zero1 end to end: the untouched skeleton, the reference solution, and its mutants (tests/labs/mistakes.py).

The references are nano's runs (held to a single-process torch AdamW by tests/nano) and official
DeepSpeed's, at 2 and 3 ranks on the tiny model; one lab directory serves every test of the module.
"""

import pytest

from tests.labs.lab_runs import (LabDirectory, mutant_outputs, assert_beside_nano_and_official, assert_every_check_passed,
                                 assert_stops_at_the_first_function, assert_the_mutant_is_caught)
from tests.labs.mistakes import mutants_of

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    return LabDirectory.start("zero1", tmp_path_factory.mktemp("labs"))


@pytest.fixture(scope="module")
def mutants(lab, tmp_path_factory):
    """What `lab check` prints for each mutant that runs to its end, from one world of runs."""
    return mutant_outputs(lab, tmp_path_factory.mktemp("mutants"))


def test_start_writes_a_package_whose_functions_name_the_lab(lab):
    names = sorted(path.name for path in lab.directory.iterdir())
    assert names == ["README.md", "__init__.py", "engine.py", "lab.py", "on_nano.py"]
    text = (lab.directory / "lab.py").read_text()
    for function in ("partition_bounds", "reduce_scatter_gradients", "all_gather_parameters"):
        assert f'raise NotImplementedError("lab zero1: write {function} in lab.py")' in text
    readme = (lab.directory / "README.md").read_text()
    assert "docs/learn/2-zero-1.md" in readme and "2 x 4 B x P / N" in readme


def test_the_untouched_skeleton_fails_on_its_first_item_naming_the_function(lab):
    assert_stops_at_the_first_function(lab.check(None, "--gpus", "2"), "zero1", "partition_bounds")


@pytest.mark.official
def test_the_reference_solution_passes_byte_for_byte_beside_nano_and_official(lab):
    done = lab.check(lab.solution())
    assert_every_check_passed(done)
    # ZeRO-1's wire: a reduce-scatter and an all-gather of (N-1)/N x 4 B x P each, P = 854,400 at N = 2
    assert "reduce_scatter: 2 calls, 1,708,800 wire B per step, as nano" in done.stdout
    assert "all_gather_single: 2 calls, 1,708,800 wire B per step, as nano" in done.stdout
    assert_beside_nano_and_official(done.stdout)
    assert "lab zero1: every check passed" in done.stdout


@pytest.mark.parametrize("mutant", mutants_of("zero1"), ids=lambda mutant: mutant.name)
def test_each_mutant_fails_its_check_with_a_hint_naming_the_function_at_fault(lab, mutant, mutants):
    assert_the_mutant_is_caught(lab, mutant, mutants)
