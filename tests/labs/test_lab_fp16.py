"""Lab fp16 end to end: the untouched skeleton, the reference solution, and two common mistakes.

The reference is nano's stage 2 in fp16 at 2 ranks on the tiny model, 6 steps: from a loss scale of
2^16 the scale doubles after every 2 good steps, and step 6 overflows at 2^18 (skipped; one unit of
hysteresis spent, the scale kept). Official DeepSpeed refuses fp16 on CPU, so it is not run.
"""

import pytest

from tests.labs.lab_runs import LabDirectory

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    return LabDirectory.start("fp16", tmp_path_factory.mktemp("labs"))


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
    assert scales == [65536, 65536, 131072, 131072, 262144, 262144]
    assert norms[-1] == float("inf") and all(norm < 10 for norm in norms[:-1])


def test_ignoring_the_hysteresis_is_caught_at_the_overflow(lab):
    done = lab.check(lab.with_mistake("no_hysteresis"), "--gpus", "2")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "step 6 (an overflow: skipped): loss scale after the step 131072, nano's 262144" in done.stdout
    assert "hint: An overflow spends hysteresis before it shrinks the scale" in done.stdout


def test_growing_the_scale_a_step_early_is_caught(lab):
    done = lab.check(lab.with_mistake("early_growth"), "--gpus", "2")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "FAIL losses (world size 2)" in done.stdout
    assert "hint: Grow the scale only after loss_scale_window good steps" in done.stdout
