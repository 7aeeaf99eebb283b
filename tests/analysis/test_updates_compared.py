"""A parity verdict counts the real updates it compared (analysis.runs.updates): losses that agree
before any update with a learning rate above 0 that moved the parameters say nothing of the
optimizer, so such a comparison is "not tested", never "yes"."""

from zero_lab.analysis.compare.comparison import build_comparison
from zero_lab.analysis.compare.metrics import parity_text
from zero_lab.analysis.report.markdown import verdict_lines
from zero_lab.analysis.runs.logparse import parse_text
from zero_lab.analysis.runs.updates import real_updates, step_updates, updates_compared

# The harness's WarmupLR (min 0, max 1e-3, 5 linear steps): updates 1 and 2 run at lr 0.
WARMUP = {1: 0.0, 2: 0.0, 3: 2e-4, 4: 4e-4, 5: 6e-4, 6: 8e-4}


def run(impl, steps, lrs=WARMUP, moved=True, applied=True):
    """A run of `steps` steps whose losses equal every other's (an optimizer bug would not show)."""
    return {"world_size": 2, "stage": 1, "impl": impl, "status": "ok", "steps": steps, "precision": "fp32",
            "loss_last": 1.0, "losses": {str(step): 10.0 - step for step in range(1, steps + 1)},
            "updates": {str(step): {"lr": lrs[step], "applied": applied, "moved": moved}
                        for step in range(1, steps + 1)}}


def verdict_of(*runs):
    return build_comparison(list(runs), ["nano", "official"])["verdict"]


def test_three_warmup_steps_compare_no_update_and_say_not_tested():
    verdict = verdict_of(run("nano", 3), run("official", 3))
    assert verdict["loss_parity"] is None and verdict["updates_compared"] == 0 and verdict["exit_code"] == 0
    assert parity_text(verdict) == "not tested"
    lines = verdict_lines(verdict)
    assert lines[0] == "**Verdict: PASS** - loss parity: not tested (tolerance 0.0001)"
    assert any("over 0 updates" in line for line in lines) and any("run at least 4 steps" in line for line in lines)


def test_each_step_past_the_warmups_zeros_adds_one_update():
    assert [verdict_of(run("nano", steps), run("official", steps))["updates_compared"] for steps in (3, 4, 5, 6)] == [
        0, 1, 2, 3]
    verdict = verdict_of(run("nano", 6), run("official", 6))
    assert verdict["loss_parity"] is True and parity_text(verdict) == "yes over 3 updates"


def test_an_update_that_moved_nothing_or_was_skipped_is_not_counted():
    assert verdict_of(run("nano", 6, moved=False), run("official", 6))["updates_compared"] == 0
    assert verdict_of(run("nano", 6), run("official", 6, applied=False))["loss_parity"] is None


def test_unequal_losses_fail_whatever_was_updated():
    broken = run("nano", 3)
    broken["losses"]["2"] += 1.0
    assert verdict_of(broken, run("official", 3))["loss_parity"] is False


def test_the_update_lr_comes_from_the_log_or_else_from_the_line_before():
    logged = parse_text("\n".join([
        "[opt_step 1] loss=5.0 lr=0 update_lr=0 update_applied=true",
        "[opt_step 2] loss=4.9 lr=0.0002 update_lr=0 update_applied=true",
        "[opt_step 3] loss=4.8 lr=0.0004 update_lr=0.0002 update_applied=false"]))
    updates = step_updates(logged.steps, {})
    assert [updates[step]["lr"] for step in "123"] == [0.0, 0.0, 2e-4] and updates["3"]["applied"] is False
    seed = parse_text("[opt_step 1] loss=5.0 lr=0.001\n[opt_step 2] loss=4.9 lr=0.001")  # no update_lr
    assert {step: update["lr"] for step, update in step_updates(seed.steps, {}).items()} == {"1": None, "2": 0.001}


def test_parameter_norms_say_whether_an_update_moved_anything():
    norms = {0: {"w": 1.0}, 1: {"w": 1.0}, 2: {"w": 1.5}}
    steps = [{"step": 1, "update_lr": 1e-3}, {"step": 2, "update_lr": 1e-3}, {"step": 3, "update_lr": 1e-3}]
    updates = step_updates(steps, norms)
    assert [updates[step]["moved"] for step in "123"] == [False, True, None]
    assert real_updates({"updates": updates}) == {2, 3}, "unknown movement does not veto a real learning rate"
    assert updates_compared(4, {"updates": updates}) == 2 and updates_compared(None, {"updates": updates}) == 0


def test_a_resume_check_counts_the_updates_the_resumed_run_made_itself():
    def resumed(impl, steps, lrs=WARMUP):
        run_after = run(impl, steps, lrs)
        run_after["losses"] = {step: loss for step, loss in run_after["losses"].items() if int(step) > steps // 2}
        return run_after

    six = build_comparison([run("nano", 6)], ["nano"], resumed=[resumed("nano", 6)])
    (check,) = six["resume_checks"]
    assert check["steps_compared"] == [4, 5, 6] and check["updates_compared"] == 2  # updates 4 and 5
    assert "exact resume: yes over 2 updates" in verdict_lines(six["verdict"])[0]
    still = {step: 0.0 for step in WARMUP}  # a learning rate of 0 throughout: nothing after the resume moved
    flat = build_comparison([run("nano", 6, still)], ["nano"], resumed=[resumed("nano", 6, still)])
    assert flat["verdict"]["resume_exact"] is None and "exact resume: not tested" in verdict_lines(flat["verdict"])[0]


def test_with_no_two_impls_that_logged_a_step_parity_is_not_applicable():
    failed = {**run("official", 3), "status": "failed", "steps": 0, "losses": {}}
    verdict = verdict_of({**run("nano", 3), "status": "failed", "steps": 0, "losses": {}}, failed)
    assert verdict["loss_parity"] is None and parity_text(verdict) == "n/a (no cell has two impls that logged a step)"


def test_a_run_that_failed_after_one_step_tests_no_update():
    """official failed after 1 of 3 steps: the one loss both logged shows no update, so no "yes"."""
    failed = {**run("official", 3), "status": "failed", "steps": 1}
    failed["losses"] = {"1": failed["losses"]["1"]}
    verdict = verdict_of(run("nano", 3), failed)
    assert verdict["exit_code"] == 3 and verdict["loss_parity"] is None and parity_text(verdict) == "not tested"
    assert verdict_lines(verdict)[0].startswith("**Verdict: RUN FAILED** - loss parity: not tested")
