"""Lab zero3 end to end: the untouched skeleton, the reference solution, and its mutants (tests/labs/mistakes.py).

The reference is nano's stage 3 at 2 and 3 ranks on the tiny model (the learner's gather and
release run inside nano's own stage-3 engine); one lab directory serves every test of the module.
"""

import pytest

from tests.labs.lab_runs import LabDirectory, mutant_outputs, assert_every_check_passed, assert_the_mutant_is_caught
from tests.labs.mistakes import mutants_of

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    return LabDirectory.start("zero3", tmp_path_factory.mktemp("labs"))


@pytest.fixture(scope="module")
def mutants(lab, tmp_path_factory):
    """What `lab check` prints for each mutant that runs to its end, from one world of runs."""
    return mutant_outputs(lab, tmp_path_factory.mktemp("mutants"))


def test_the_untouched_skeleton_fails_on_its_first_item_naming_the_function(lab):
    done = lab.check(None, "--gpus", "2")
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stdout.startswith("FAIL runs (world size 2)\n"), done.stdout
    assert "lab zero3's release_unit is not written yet" in done.stdout  # nano releases every unit it builds first


def test_the_reference_solution_passes_byte_for_byte_beside_nano(lab):
    done = lab.check(lab.solution(), "--no-official")
    assert_every_check_passed(done)
    # stage 3 holds a partition of the parameters: 5,272,708 B after the step at 2 ranks, ZeRO-1's 6,847,620 less
    # 1,574,912 B, what the sharded units keep of 4 B x P / 2 less the persistent small parameters kept whole
    assert "after_step: holds 5,272,708 B (nano 5,272,708 B)" in done.stdout


@pytest.mark.parametrize("mutant", mutants_of("zero3"), ids=lambda mutant: mutant.name)
def test_each_mutant_fails_its_check_with_a_hint_naming_the_function_at_fault(lab, mutant, mutants):
    assert_the_mutant_is_caught(lab, mutant, mutants)
