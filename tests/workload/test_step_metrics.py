"""A step's `[warn]` lines, from its loss and whether the engine skipped it."""

import math

from zero_lab.workload.step_metrics import step_warnings


def test_a_finite_applied_step_warns_nothing():
    assert step_warnings(3, 5.5, 1.0, skipped=False) == []


def test_each_problem_is_its_own_warning():
    assert step_warnings(4, 2.0, 65536.0, skipped=True) == [
        {"step": 4, "kind": "skipped_step", "loss_scale": 65536.0}]
    (loss_warning,) = step_warnings(5, math.inf, 1.0, skipped=False)
    assert loss_warning["kind"] == "non_finite_loss" and loss_warning["loss"] == math.inf
    assert [w["kind"] for w in step_warnings(6, math.nan, 1.0, skipped=True)] == [
        "non_finite_loss", "skipped_step"]
