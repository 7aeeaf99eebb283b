"""compare with three impls (nano, official, fsdp2): deltas against --baseline, loss parity
checked pairwise, one three-column table per cell. Pure: summaries made here, nothing launched."""

import pytest

from tests.analysis.test_metrics import summary
from zero_lab.analysis.compare.comparison import build_comparison
from zero_lab.analysis.report.markdown import render_report

IMPLS = ["nano", "official", "fsdp2"]


def three(fsdp2_losses=(5.0, 4.0), fsdp2_alloc=50.0):
    return [summary("nano", alloc=80.0), summary("official", alloc=100.0),
            summary("fsdp2", losses=fsdp2_losses, alloc=fsdp2_alloc)]


def test_every_candidate_is_measured_against_the_baseline_and_candidates_against_each_other():
    comparison = build_comparison(three(), IMPLS)
    pairs = [(d["impl"], d["baseline"], d["against_baseline"]) for d in comparison["deltas"]]
    assert pairs == [("nano", "official", True), ("fsdp2", "official", True), ("nano", "fsdp2", False)]
    assert comparison["baseline"] == "official"
    fsdp2 = comparison["deltas"][1]
    assert fsdp2["alloc_max_mb_delta"] == -50.0 and fsdp2["alloc_max_mb_delta_pct"] == -50.0
    assert comparison["verdict"]["ok"]


@pytest.mark.parametrize("baseline", ["nano", "fsdp2"])
def test_baseline_chooses_what_the_deltas_are_relative_to(baseline):
    deltas = build_comparison(three(), IMPLS, baseline=baseline)["deltas"]
    assert {d["baseline"] for d in deltas if d["against_baseline"]} == {baseline}
    assert len(deltas) == 3


def test_without_the_baseline_impl_the_second_impl_is_it():
    deltas = build_comparison([summary("nano"), summary("fsdp2")], ["nano", "fsdp2"])["deltas"]
    assert [(d["impl"], d["baseline"]) for d in deltas] == [("nano", "fsdp2")]


def test_a_loss_gap_between_two_candidates_alone_fails_the_verdict():
    """fsdp2 agrees with official within 1e-4 and nano agrees with official, yet nano and fsdp2
    differ by more: only the pairwise check sees it."""
    runs = [summary("nano", losses=(5.0, 4.00006)), summary("official", losses=(5.0, 4.0)),
            summary("fsdp2", losses=(5.0, 3.99994))]
    verdict = build_comparison(runs, IMPLS)["verdict"]
    assert not verdict["ok"] and verdict["exit_code"] == 1
    (failure,) = verdict["loss_parity_failures"]
    assert failure.startswith("world_size=2 stage=2 (nano vs fsdp2): max step loss delta 0.00012")


def test_memory_regressions_are_judged_against_the_baseline_only():
    verdict = build_comparison(three(fsdp2_alloc=120.0), IMPLS, fail_on_regression=10.0)["verdict"]
    assert [line.split(":")[1].split()[0] for line in verdict["memory_regressions"]] == ["alloc_max_mb",
                                                                                       "peak_alloc_max_mb"]


def test_the_report_has_one_table_per_cell_with_a_column_per_impl():
    runs = three()
    text = render_report(build_comparison(runs, IMPLS), runs, "t", plots=[])
    assert "## world size 2, stage 2: nano, fsdp2 vs official" in text
    assert "| metric | nano | fsdp2 | official | nano delta % | fsdp2 delta % |" in text
    assert "max step loss delta nano vs fsdp2" in text
