"""Lab zero3 end to end: the untouched skeleton, the reference solution, and two common mistakes.

The reference is nano's stage 3 at 2 and 3 ranks on the tiny model (the learner's gather and
release run inside nano's own stage-3 engine); one lab directory serves every test of the module.
"""

import pytest

from tests.labs.lab_runs import LabDirectory, assert_every_check_passed

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    return LabDirectory.start("zero3", tmp_path_factory.mktemp("labs"))


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


def test_forgetting_to_release_is_caught_in_the_bytes(lab):
    done = lab.check(lab.with_mistake("no_release"), "--gpus", "2", "--no-official")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "PASS losses (world size 2)" in done.stdout and "FAIL bytes (world size 2)" in done.stdout
    assert "gathered_parameters 3,149,824 B, the formula (nano's) 0 B" in done.stdout
    assert "hint: a unit's gathered parameters outlive its use: release the unit" in done.stdout


def test_all_reducing_whole_buffers_is_caught_in_the_wire_bytes(lab):
    done = lab.check(lab.with_mistake("all_reduce"), "--gpus", "2", "--no-official")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "PASS bytes (world size 2)" in done.stdout and "FAIL wire (world size 2)" in done.stdout
    assert "hint: you all-reduce where nano reduce-scatters or all-gathers" in done.stdout
