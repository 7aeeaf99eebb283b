"""Lab offload end to end: the untouched skeleton, the reference solution, and its mutants (tests/labs/mistakes.py).

The references are nano's stage 2 with `offload_optimizer: {device: cpu}` (the learner's two moves
run inside nano's own engine) and official DeepSpeed's, at 2 and 3 ranks on the tiny model, 6
steps: the warm-up's learning rate first moves the weights at step 3, so the losses of steps 4-6
show 3 updates, and the parameters after each step are compared too. One lab directory serves every test of the module (what `start`
writes is checked for every lab by test_lab_inputs.py).
"""

import json

import pytest

from tests.labs.lab_runs import (LabDirectory, mutant_outputs, assert_beside_nano_and_official, assert_every_check_passed,
                                 assert_stops_at_the_first_function, assert_the_mutant_is_caught)
from tests.labs.mistakes import mutants_of

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    return LabDirectory.start("offload", tmp_path_factory.mktemp("labs"))


@pytest.fixture(scope="module")
def mutants(lab, tmp_path_factory):
    """What `lab check` prints for each mutant that runs to its end, from one world of runs."""
    return mutant_outputs(lab, tmp_path_factory.mktemp("mutants"))


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


@pytest.mark.parametrize("mutant", mutants_of("offload"), ids=lambda mutant: mutant.name)
def test_each_mutant_fails_its_check_with_a_hint_naming_the_function_at_fault(lab, mutant, mutants):
    assert_the_mutant_is_caught(lab, mutant, mutants)
