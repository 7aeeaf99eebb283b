"""Lab fp16 end to end: the untouched skeleton, the reference solution, and its mutants (tests/labs/mistakes.py).

The reference is nano's stage 2 in fp16 at 2 ranks on the tiny model (32 tokens a sample), 9 steps:
from a loss scale of 2^16 the scale doubles after every 2 good steps, step 6 overflows at 2^18
(skipped; one unit of hysteresis spent, the scale kept), step 7 overflows again (the scale halved),
and steps 8 and 9 are the good steps counted from that overflow. Official DeepSpeed refuses fp16 on CPU, so it is not run.
"""

import pytest

from tests.labs.lab_runs import LabDirectory, mutant_outputs, assert_the_mutant_is_caught
from tests.labs.mistakes import mutants_of

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    return LabDirectory.start("fp16", tmp_path_factory.mktemp("labs"))


@pytest.fixture(scope="module")
def mutants(lab, tmp_path_factory):
    """What `lab check` prints for each mutant that runs to its end, from one world of runs."""
    return mutant_outputs(lab, tmp_path_factory.mktemp("mutants"))


def test_the_untouched_skeleton_fails_on_its_first_item_naming_the_function(lab):
    done = lab.check(None, "--gpus", "2")
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stdout.startswith("FAIL runs (world size 2)\n"), done.stdout
    assert "lab fp16's update_scale is not written yet" in done.stdout


def test_the_reference_solution_passes_beside_nano_through_an_overflow(lab):
    done = lab.check(lab.solution(), "--gpus", "2")
    assert done.returncode == 0, done.stdout + done.stderr
    for check in ("runs", "losses", "bytes", "wire"):
        assert f"PASS {check} (world size 2)" in done.stdout
    assert "official DeepSpeed rejects fp16 on CPU" in done.stderr
    metrics = (lab.directory / ".zero-lab" / "w2-yours" / "metrics.csv").read_text().splitlines()
    header = metrics[0].split(",")
    scales = [float(row.split(",")[header.index("loss_scale")]) for row in metrics[1:]]
    norms = [float(row.split(",")[header.index("grad_norm")]) for row in metrics[1:]]
    assert scales == [65536, 65536, 131072, 131072, 262144, 262144, 131072, 131072, 131072]
    assert norms[5] == norms[6] == float("inf") and all(norm < 10 for norm in norms[:5] + norms[7:])


@pytest.mark.parametrize("mutant", mutants_of("fp16"), ids=lambda mutant: mutant.name)
def test_each_mutant_fails_its_check_with_a_hint_naming_the_function_at_fault(lab, mutant, mutants):
    assert_the_mutant_is_caught(lab, mutant, mutants)
