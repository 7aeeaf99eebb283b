"""Lab zero2 end to end: the untouched skeleton, the reference solution, and two common mistakes.

The reference is nano at 2 and 3 ranks on the tiny model (official DeepSpeed beside it is lab
zero1's test); one lab directory serves every test of the module.
"""

import pytest

from tests.labs.lab_runs import LabDirectory, assert_every_check_passed

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    return LabDirectory.start("zero2", tmp_path_factory.mktemp("labs"))


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


def test_keeping_the_full_gradients_is_caught_where_they_leak_into_the_next_step(lab):
    done = lab.check(lab.with_mistake("keeps_gradients"), "--gpus", "2", "--no-official")
    assert done.returncode == 1, done.stdout + done.stderr
    # never released, parameter.grad is never zeroed either: step 2's gradients add onto step 1's
    assert "FAIL losses (world size 2)" in done.stdout and "  step 2: gradient norm " in done.stdout
    assert "hint: step 1 agrees and a later step does not: a step's gradients leak into the next" in done.stdout


def test_keeping_the_bucket_is_caught_in_the_bytes(lab):
    done = lab.check(lab.with_mistake("keeps_bucket"), "--gpus", "2", "--no-official")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "PASS losses (world size 2)" in done.stdout and "FAIL bytes (world size 2)" in done.stdout
    # the padded flat buffer of the gradients, 4 B x P, held into the next step's forward, where the formula has none
    assert "after_forward: communication_buckets 3,417,600 B, the formula (nano's) 0 B" in done.stdout
    assert "hint: the gradient bucket outlives its reduce-scatter: release it" in done.stdout


def test_all_reducing_the_bucket_is_caught_in_the_wire_bytes(lab):
    done = lab.check(lab.with_mistake("all_reduce"), "--gpus", "2", "--no-official")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "PASS bytes (world size 2)" in done.stdout and "FAIL wire (world size 2)" in done.stdout
    # the whole bucket all-reduced: 2 (N-1)/N x 4 B x P = 3,417,600 B, plus the gradient norm's 4 B
    assert "all_reduce: 3 calls, 3,417,604 wire B per step; nano's 1 calls, 4 B" in done.stdout
    assert "hint: you all-reduce where nano reduce-scatters or all-gathers" in done.stdout
