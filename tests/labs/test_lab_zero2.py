"""Lab zero2 end to end: the untouched skeleton, the reference solution, and its mutants (tests/labs/mistakes.py).

The reference is nano at 2 and 3 ranks on the tiny model (official DeepSpeed beside it is lab
zero1's test); one lab directory serves every test of the module.
"""

import pytest

from tests.labs.lab_runs import LabDirectory, mutant_outputs, assert_every_check_passed, assert_the_mutant_is_caught
from tests.labs.mistakes import mutants_of

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    return LabDirectory.start("zero2", tmp_path_factory.mktemp("labs"))


@pytest.fixture(scope="module")
def mutants(lab, tmp_path_factory):
    """What `lab check` prints for each mutant that runs to its end, from one world of runs."""
    return mutant_outputs(lab, tmp_path_factory.mktemp("mutants"))


def test_the_untouched_skeleton_fails_on_its_first_item_naming_the_function(lab):
    done = lab.check(None, "--gpus", "2")
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stdout.startswith("FAIL runs (world size 2)\n"), done.stdout
    assert "lab zero2's partition_bounds is not written yet" in done.stdout


def test_the_reference_solution_passes_byte_for_byte_beside_nano(lab):
    done = lab.check(lab.solution(), "--no-official")
    assert_every_check_passed(done)
    # after backward ZeRO-2 holds its gradient partition (4 B x P / 2) where ZeRO-1 holds 4 B x P of param.grad:
    # 8,556,420 B against lab zero1's 10,265,220 B at 2 ranks, 1,708,800 B less
    assert "after_backward: holds 8,556,420 B (nano 8,556,420 B)" in done.stdout


@pytest.mark.parametrize("mutant", mutants_of("zero2"), ids=lambda mutant: mutant.name)
def test_each_mutant_fails_its_check_with_a_hint_naming_the_function_at_fault(lab, mutant, mutants):
    assert_the_mutant_is_caught(lab, mutant, mutants)
