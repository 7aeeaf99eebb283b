"""Run summaries, deltas and verdicts: the numbers `compare` reports and gates on (summaries in
analysis.runs.tables, deltas in analysis.compare.comparison, the verdict's rules in analysis.compare.metrics)."""

import math

import pytest

from zero_lab.analysis.runs.logparse import parse_text
from zero_lab.analysis.compare.comparison import build_comparison
from zero_lab.analysis.compare.metrics import verdict
from zero_lab.analysis.runs.tables import summarize_run


REAL_UPDATE = {"lr": 1e-3, "applied": True, "moved": True}


def summary(impl, stage=2, world_size=2, status="ok", losses=(5.0, 4.0), alloc=100.0, step_ms=10.0, **extra):
    """A run whose every update was real (a learning rate above 0 that moved the parameters)."""
    return {"world_size": world_size, "stage": stage, "impl": impl, "status": status, "steps": len(losses),
            "loss_last": losses[-1] if losses else None, "alloc_max_mb": alloc, "peak_alloc_max_mb": alloc * 2,
            "reserved_max_mb": 800.0, "peak_reserved_max_mb": 900.0, "step_ms": step_ms, "comm_mb": 6.0,
            "precision": "fp32", "losses": {str(i + 1): loss for i, loss in enumerate(losses)},
            "updates": {str(i + 1): REAL_UPDATE for i in range(len(losses))}, **extra}


def cell_delta(candidate, baseline, candidate_losses, baseline_losses, loss_tol):
    """The one delta of a cell with these two runs and these per-step losses."""
    def with_losses(summary, losses):
        return {**summary, "losses": {str(step): loss for step, loss in losses.items()}}

    comparison = build_comparison([with_losses(candidate, candidate_losses), with_losses(baseline, baseline_losses)],
                                  [candidate["impl"], baseline["impl"]], loss_tol)
    (delta,) = comparison["deltas"]
    return delta


def max_step_loss_delta(candidate_losses, baseline_losses):
    return cell_delta(summary("nano"), summary("official"), candidate_losses, baseline_losses, 1e-4)["max_step_loss_delta"]


def test_summarize_takes_memory_maxima_and_steady_step_time():
    log = parse_text("\n".join([
        "[opt_step 1] loss=5.0 step_ms=900.0 alloc_max_mb=10.0 peak_alloc_max_mb=50.0 comm_mb=1.0",
        "[opt_step 2] loss=4.0 step_ms=100.0 alloc_max_mb=12.0 peak_alloc_max_mb=40.0 comm_mb=1.0",
        "[opt_step 3] loss=3.0 step_ms=120.0 alloc_max_mb=11.0 peak_alloc_max_mb=45.0 comm_mb=1.0",
    ]))
    row = summarize_run(log)
    assert row["steps"] == 3 and row["loss_last"] == 3.0
    assert row["alloc_max_mb"] == 12.0 and row["peak_alloc_max_mb"] == 50.0
    assert row["step_ms"] == 110.0, "step 1 (start-up) is left out of the median"
    assert row["reserved_max_mb"] is None, "a field the log lacks stays None"


def test_delta_is_candidate_minus_baseline_with_percent_of_baseline():
    nano, official = summary("nano", alloc=110.0, step_ms=15.0), summary("official", alloc=100.0, step_ms=10.0)
    delta = cell_delta(nano, official, {1: 5.0, 2: 4.00001}, {1: 5.0, 2: 4.0}, loss_tol=1e-4)
    assert delta["impl"] == "nano" and delta["baseline"] == "official"
    assert delta["alloc_max_mb_delta"] == pytest.approx(10.0)
    assert delta["alloc_max_mb_delta_pct"] == pytest.approx(10.0)
    assert delta["peak_alloc_max_mb_delta_pct"] == pytest.approx(10.0)
    assert delta["reserved_max_mb_delta"] == 0.0
    assert delta["max_step_loss_delta"] == pytest.approx(1e-5)
    assert delta["step_time_ratio"] == pytest.approx(1.5)
    assert delta["comm_wire_ratio"] is None, "no wire bytes in these rows: no ratio"
    assert delta["loss_parity"] is True and delta["updates_compared"] == 1, "step 2's loss reflects update 1"


def test_wire_ratio_is_candidate_over_baseline():
    nano, official = summary("nano", comm_wire_mb=2.0), summary("official", comm_wire_mb=3.0)
    assert cell_delta(nano, official, {}, {}, 1e-4)["comm_wire_ratio"] == pytest.approx(2 / 3)
    log = parse_text("\n".join(f"[opt_step {k}] loss=1.0 comm_mb=4.0 comm_wire_mb={k}.0" for k in (1, 2, 3, 4)))
    assert summarize_run(log)["comm_wire_mb"] == 3.0, "the median over steps 2-4"


def test_loss_parity_fails_beyond_tolerance_and_on_nan():
    assert max_step_loss_delta({1: 1.0, 2: float("nan")}, {1: 1.0, 2: 1.0}) == math.inf
    assert max_step_loss_delta({1: 1.0}, {2: 1.0}) is None, "no common step: no verdict on parity"
    delta = cell_delta(summary("nano"), summary("official"), {1: 5.0, 2: 4.1}, {1: 5.0, 2: 4.0}, loss_tol=1e-4)
    assert delta["loss_parity"] is False


def test_verdict_exit_codes():
    ok = summary("nano")
    delta_ok = cell_delta(ok, summary("official"), {1: 1.0}, {1: 1.0}, 1e-4)
    assert verdict([ok], [delta_ok], 1e-4, None)["exit_code"] == 0
    regressed = cell_delta(summary("nano", alloc=120.0), summary("official"), {1: 1.0}, {1: 1.0}, 1e-4)
    gate = verdict([ok], [regressed], 1e-4, fail_on_regression=5.0)
    assert gate["exit_code"] == 1 and len(gate["memory_regressions"]) == 2  # alloc and peak alloc, +20%
    assert verdict([ok], [regressed], 1e-4, fail_on_regression=25.0)["exit_code"] == 0
    unequal = cell_delta(ok, summary("official"), {1: 1.0}, {1: 2.0}, 1e-4)
    assert verdict([ok], [unequal], 1e-4, None)["exit_code"] == 1
    failed = summary("official", status="failed")
    assert verdict([ok, failed], [unequal], 1e-4, None)["exit_code"] == 3, "a failed run outranks a gate"


def test_an_interrupted_verdict_says_so_with_the_exit_code_the_command_ends_with():
    from zero_lab.analysis.report.markdown import verdict_lines

    ok, failed = summary("nano"), summary("official", stage=1, status="failed")
    cut = summary("official", status="interrupted", losses=(5.0,), interrupted_by="SIGTERM")
    by_row = verdict([ok, failed, cut], [], 1e-4, None)
    assert (by_row["exit_code"], by_row["interrupted_by"], by_row["ok"]) == (143, "SIGTERM", False)
    assert by_row["failed_runs"] == ["world_size=2 stage=1 impl=official: failed"], "interrupted is not failed"
    assert verdict_lines(by_row)[0].startswith("**Verdict: INTERRUPTED (SIGTERM)**")
    between_runs = build_comparison([ok], ["nano", "official"], interrupted_by="SIGHUP")["verdict"]
    assert (between_runs["exit_code"], between_runs["interrupted_by"]) == (129, "SIGHUP")
    ctrl_c = summary("nano", status="interrupted")  # a summary.json written before interrupted_by existed
    assert verdict([ctrl_c], [], 1e-4, None)["exit_code"] == 130


def test_build_comparison_orders_rows_and_pairs_cells():
    summaries = [summary("official", stage=2), summary("nano", stage=2), summary("official", stage=1),
                 summary("nano", stage=1), summary("nano", stage=3, status="failed", losses=())]
    comparison = build_comparison(summaries, ["nano", "official"])
    assert [(r["stage"], r["impl"]) for r in comparison["rows"]] == [
        (1, "nano"), (1, "official"), (2, "nano"), (2, "official"), (3, "nano")]
    assert [(d["stage"], d["impl"], d["baseline"]) for d in comparison["deltas"]] == [
        (1, "nano", "official"), (2, "nano", "official")]
    assert "losses" not in comparison["rows"][0]
    assert comparison["verdict"]["exit_code"] == 3 and comparison["verdict"]["loss_parity"] is True
    assert comparison["verdict"]["loss_tol"] == 1e-4, "fp32 default tolerance"
    assert build_comparison([summary("nano")], ["nano", "official"])["verdict"]["loss_parity"] is None


def test_resume_check_passes_only_on_equal_losses_after_the_checkpoint():
    from zero_lab.analysis.report.markdown import verdict_lines
    straight = [summary("nano", losses=(5.0, 4.0, 3.0, 2.0)), summary("official", losses=(5.0, 4.0, 3.0, 2.0))]
    resumed = [{**summary("nano", losses=(5.0, 4.0, 3.0, 2.0)), "losses": {"3": 3.0, "4": 2.0}},
               {**summary("official"), "losses": {"3": 3.0, "4": 2.5}}]
    comparison = build_comparison(straight, ["nano", "official"], resumed=resumed)
    checks = {check["impl"]: check for check in comparison["resume_checks"]}
    assert checks["nano"]["exact"] and checks["nano"]["steps_compared"] == [3, 4]
    assert not checks["official"]["exact"] and checks["official"]["max_step_loss_delta"] == 0.5
    assert comparison["verdict"]["exit_code"] == 1 and comparison["verdict"]["resume_exact"] is False
    assert "exact resume: NO" in verdict_lines(comparison["verdict"])[0]
    assert "resume_checks" not in build_comparison(straight, ["nano", "official"])


def test_a_nan_loss_in_the_uninterrupted_run_is_no_exact_resume():
    # Before pandas, max() over the gaps skipped a NaN that came after a 0.0 and called this exact.
    straight = [summary("nano", losses=(5.0, 4.0, float("nan")))]
    resumed = [{**summary("nano"), "losses": {"2": 4.0, "3": 3.0}}]
    (check,) = build_comparison(straight, ["nano", "official"], resumed=resumed)["resume_checks"]
    assert check["steps_compared"] == [2, 3] and check["max_step_loss_delta"] == math.inf and not check["exact"]


def test_percentages_and_ratios_need_a_baseline_other_than_zero():
    nano, official = summary("nano", step_ms=15.0, comm_wire_mb=2.0), summary("official", alloc=0.0, step_ms=0.0,
                                                                               comm_wire_mb=0.0)
    delta = cell_delta(nano, official, {1: 5.0}, {1: 5.0}, 1e-4)
    assert delta["alloc_max_mb_delta"] == 100.0 and delta["alloc_max_mb_delta_pct"] is None
    assert delta["step_time_ratio"] is None and delta["comm_wire_ratio"] is None
    assert delta["reserved_max_mb_delta_pct"] == 0.0
