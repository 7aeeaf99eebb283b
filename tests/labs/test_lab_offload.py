"""Lab offload end to end: the untouched skeleton, the reference solution, and two common mistakes.

The references are nano's stage 2 with `offload_optimizer: {device: cpu}` (the learner's two moves
run inside nano's own engine) and official DeepSpeed's, at 2 and 3 ranks on the tiny model, 4
steps: the warm-up's learning rate first moves the weights at step 3, so step 4 is the first whose
forward reads updated weights. One lab directory serves every test of the module (what `start`
writes is checked for every lab by test_lab_inputs.py).
"""

import json

import pytest

from tests.labs.lab_runs import (LabDirectory, assert_beside_nano_and_official, assert_every_check_passed,
                                  assert_stops_at_the_first_function)

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    return LabDirectory.start("offload", tmp_path_factory.mktemp("labs"))


def after_step(lab, world_size: int) -> dict:
    """The learner's run's last `[phase]` sample after the step, at `world_size` ranks."""
    summary = json.loads((lab.directory / ".zero-lab" / f"w{world_size}-yours" / "summary.json").read_text())
    return next(sample for sample in summary["phases"] if sample["phase"] == "after_step")


def test_the_untouched_skeleton_fails_on_its_first_item_naming_the_function(lab):
    assert_stops_at_the_first_function(lab.check(None, "--gpus", "2"), "offload", "host_master_partition")


@pytest.mark.official
def test_the_reference_solution_passes_byte_for_byte_beside_nano_and_official(lab):
    done = lab.check(lab.solution())
    assert_every_check_passed(done)
    for world_size in (2, 3):  # the host holds the fp32 master partition, 4 B x P / N, and Adam's two states
        sample = after_step(lab, world_size)
        padded = sample["parameters_bytes"] // 4  # the device keeps the whole flat buffer, 4 B x P
        assert sample["fp32_master_partition_bytes"] == 4 * padded // world_size
        assert sample["optimizer_states_bytes"] == 2 * 4 * padded // world_size
    # lab zero2's ZeRO-2 holds 8,556,420 B after backward at 2 ranks: offload adds the master's 1,708,800 B
    assert "after_backward: holds 10,265,220 B (nano 10,265,220 B)" in done.stdout
    assert "reduce_scatter: 2 calls, 1,708,800 wire B per step, as nano" in done.stdout
    assert_beside_nano_and_official(done.stdout)
    assert "lab offload: every check passed" in done.stdout


def test_a_master_that_is_the_partition_itself_is_caught_in_the_bytes(lab):
    done = lab.check(lab.with_mistake("master_is_partition"), "--gpus", "2", "--no-official")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "PASS losses (world size 2)" in done.stdout and "FAIL bytes (world size 2)" in done.stdout
    assert "after_forward: fp32_master_partition 0 B, the formula (nano's) 1,708,800 B" in done.stdout
    assert "hint: no fp32 master partition of its own" in done.stdout


def test_not_copying_the_master_back_is_caught_where_the_weights_first_move(lab):
    done = lab.check(lab.with_mistake("no_copy_back"), "--gpus", "2", "--no-official")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "FAIL losses (world size 2)" in done.stdout and "  step 4: gradient norm " in done.stdout
    assert "hint: the first steps agree and a later one does not: Adam changed the master on the host" in done.stdout
