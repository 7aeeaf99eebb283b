"""Step times with their noise (analysis.runs.speed.step_times), and how compare reports and gates on them:
synthetic per-step times, seeded, nothing launched."""

import numpy as np
import pytest

from tests.analysis.test_metrics import summary
from zero_lab.analysis.runs.speed import step_times
from zero_lab.analysis.compare.comparison import build_comparison
from zero_lab.analysis.report.markdown import render_report
from zero_lab.analysis.runs.speed.step_times import ratio_interval, start_up_steps, steady_times, time_verdict

# A real run's step times (small model, nano, stage 1, 2 CPU processes): steps 2-8 are still slow.
RAMPING = [5075.0, 3640.9, 3831.3, 3116.5, 3510.8, 3302.9, 2924.4, 2723.8, 1979.8, 1841.6, 1752.4, 1769.0, 2276.0,
           1741.7, 1757.2, 1542.6, 1558.1, 1682.9, 2107.0, 1900.8]


def draws(seed: int, median: float, spread: float, count: int = 19) -> list[float]:
    """count step times around median, log-normal (positive, skewed to slow as step times are) with
    a standard deviation of spread in the log: about spread x median for a small spread."""
    return list(median * np.exp(np.random.default_rng(seed).normal(0.0, spread, count)))


def verdict_of(candidate, baseline) -> str | None:
    """The verdict on one run of each impl."""
    return time_verdict(ratio_interval([candidate], [baseline]))


@pytest.mark.parametrize("times, start_up", [
    ([], 0),
    ([900.0], 0),  # the only measurement there is
    ([900.0, 100.0], 1),
    ([900.0, 500.0, 100.0], 1),  # too few steps to tell a steady state: step 1 only
    ([900.0, 100.0, 101.0, 99.0, 100.0, 102.0], 1),
    ([900.0, 400.0, 300.0, 100.0, 101.0, 99.0, 100.0, 102.0], 3),  # steps 2 and 3 above the fence
    ([900.0, 100.0, 400.0, 101.0, 99.0, 100.0, 102.0, 100.0], 1),  # a slow step after a steady one is noise
    ([900.0, 100.0, 101.0, 99.0, 100.0, 102.0, 100.0, 400.0], 1),  # a late spike is not start-up
    ([900.0, 800.0, 800.0, 800.0, 800.0, 800.0, 100.0, 100.0, 100.0, 100.0], 5),  # never past the earlier half
    (RAMPING, 8),
])
def test_start_up_is_step_1_then_the_leading_steps_above_the_later_halfs_fence(times, start_up):
    assert start_up_steps(times) == start_up
    assert steady_times(times) == times[start_up:]


def test_the_fence_is_tukeys_over_the_later_half():
    later = [100.0, 110.0, 120.0, 130.0]  # Q1 107.5, Q3 122.5: fence 122.5 + 1.5 x 15 = 145
    assert start_up_steps([900.0, 145.0, 100.0, 100.0, *later]) == 1, "at the fence: steady"
    assert start_up_steps([900.0, 145.5, 100.0, 100.0, *later]) == 2, "above it: start-up"


@pytest.mark.parametrize("seed", range(10))
def test_equal_distributions_are_within_noise(seed):
    times = draws(seed, 1000.0, 0.1)
    shuffled = list(np.random.default_rng(seed + 100).permutation(times))
    assert verdict_of(shuffled, times) == "within noise"


def test_independent_draws_of_one_distribution_are_within_noise_at_least_9_times_in_10():
    """A 95% interval misses 1.0 about 1 time in 20 when the impls do not differ (here 6 of 200)."""
    verdicts = [verdict_of(draws(seed, 1000.0, 0.1), draws(seed + 1000, 1000.0, 0.1)) for seed in range(200)]
    assert verdicts.count("within noise") >= 180, verdicts.count("within noise")
    assert verdicts.count("faster") > 0 and verdicts.count("slower") > 0, "the false calls go both ways"


@pytest.mark.parametrize("seed", range(10))
def test_a_20_percent_shift_with_low_spread_is_faster_or_slower(seed):
    baseline, candidate = draws(seed, 1000.0, 0.03), draws(seed + 1000, 800.0, 0.03)
    assert verdict_of(candidate, baseline) == "faster"
    assert verdict_of(baseline, candidate) == "slower"
    low, high = ratio_interval([candidate], [baseline])
    assert low < np.median(candidate) / np.median(baseline) < high < 1.0


def test_the_same_shift_in_a_wide_spread_is_within_noise():
    assert verdict_of(draws(1, 800.0, 0.6, count=6), draws(2, 1000.0, 0.6, count=6)) == "within noise"


def test_the_interval_is_seeded_and_needs_three_steps_a_side():
    candidate, baseline = [draws(3, 900.0, 0.1)], [draws(4, 1000.0, 0.1)]
    assert ratio_interval(candidate, baseline) == ratio_interval([list(candidate[0])], [list(baseline[0])])
    assert ratio_interval(candidate, baseline, seed=1) != ratio_interval(candidate, baseline)
    assert ratio_interval([[900.0, 910.0]], baseline) is None and time_verdict(None) is None
    assert ratio_interval([[900.0], [910.0, 920.0]], baseline) is not None, "three steps over two runs"


def test_a_run_that_disagrees_with_the_others_widens_the_interval_as_pooled_steps_would_not():
    """Three runs, each steady within itself (1% spread), one of them 20% faster than the other two
    (a whole run on a quieter machine): resampled by steps alone, the pooled steps sit in the two
    slow runs' cluster and read `slower`; resampled by runs, then steps, one run in three
    disagreeing is seen, and the interval spans it."""
    runs = [draws(10, 1150.0, 0.01), draws(11, 1120.0, 0.01), draws(12, 950.0, 0.01)]
    baseline = [draws(13, 1000.0, 0.01)]
    assert verdict_of(runs[0] + runs[1] + runs[2], baseline[0]) == "slower"
    low, high = ratio_interval(runs, baseline)
    assert low < 0.96 and high > 1.14 and time_verdict((low, high)) == "within noise"


def timed(impl, times, **extra):
    """A run summary whose per-step times are `times` (its step_ms the median after step 1)."""
    return summary(impl, step_ms=float(np.median(times[1:])),
                   step_times_ms={str(step): ms for step, ms in enumerate(times, 1)}, **extra)


def test_compare_gives_each_delta_its_interval_and_verdict():
    nano, official = [2000.0, *draws(5, 800.0, 0.03)], [2000.0, *draws(6, 1000.0, 0.03)]
    comparison = build_comparison([timed("nano", nano), timed("official", official)], ["nano", "official"])
    (delta,) = comparison["deltas"]
    assert delta["step_time_ratio"] == pytest.approx(np.median(nano[1:]) / np.median(official[1:]))
    assert delta["step_time_ratio_low"] < delta["step_time_ratio"] < delta["step_time_ratio_high"] < 1.0
    assert delta["step_time_verdict"] == "faster"
    entry = {entry["impl"]: entry for entry in comparison["step_times"]}["nano"]
    assert (entry["runs"], entry["steps"], entry["start_up_steps"]) == (1, 19, [1])
    assert entry["step_ms"] == pytest.approx(np.median(nano[1:]))
    assert entry["step_ms_q1"] < entry["step_ms"] < entry["step_ms_q3"]
    text = render_report(comparison, [timed("nano", nano), timed("official", official)], "t", plots=[])
    ratio = (f"{delta['step_time_ratio']:.2f} ({delta['step_time_ratio_low']:.2f}-"
             f"{delta['step_time_ratio_high']:.2f})")
    assert f"| faster | ratio {ratio} |" in text
    assert "| step times measured | 19 steps, 1 run | 19 steps, 1 run |" in text
    assert "Memory and wire bytes are exact counts and need no interval" in text


def test_repeats_pool_their_steady_steps_and_the_deltas_read_the_first_run():
    runs = [timed("nano", [2000.0, 900.0, 910.0, 920.0, 930.0], alloc=100.0),
            timed("official", [2000.0, 1000.0, 1010.0, 1020.0, 1030.0]),
            timed("nano", [2000.0, 700.0, 710.0, 720.0, 730.0], alloc=120.0),
            timed("official", [2000.0, 1100.0, 1110.0, 1120.0, 1130.0])]
    comparison = build_comparison(runs, ["nano", "official"])
    assert [(row["impl"], row["repeat"]) for row in comparison["rows"]] == [
        ("nano", 1), ("nano", 2), ("official", 1), ("official", 2)]
    (delta,) = comparison["deltas"]
    assert delta["alloc_max_mb_delta"] == 0.0, "memory: each impl's first run"
    nano, official = ({entry["impl"]: entry for entry in comparison["step_times"]}[impl] for impl in ("nano", "official"))
    assert (nano["runs"], nano["steps"], nano["start_up_steps"]) == (2, 8, [1, 1])
    assert nano["step_ms"] == np.median([900.0, 910.0, 920.0, 930.0, 700.0, 710.0, 720.0, 730.0])
    assert delta["step_time_ratio"] == pytest.approx(nano["step_ms"] / official["step_ms"])
    assert "| nano | 2 |" in render_report(comparison, runs, "t", plots=[]), "the run table numbers the repeats"


def test_a_summary_without_per_step_times_keeps_its_step_ms_and_gets_no_interval():
    (delta,) = build_comparison([summary("nano", step_ms=15.0), summary("official", step_ms=10.0)],
                                ["nano", "official"])["deltas"]
    assert delta["step_time_ratio"] == pytest.approx(1.5)
    assert (delta["step_time_ratio_low"], delta["step_time_ratio_high"], delta["step_time_verdict"]) == (None,) * 3


WIDE = [600.0, 1400.0, 800.0, 1200.0, 1000.0, 700.0, 1300.0, 900.0]


@pytest.mark.parametrize("official, shift, gate_pct, fails", [
    (draws(8, 1000.0, 0.03, 8), 1.2, 5.0, True),  # slower, by 20% > 5%
    (draws(8, 1000.0, 0.03, 8), 1.2, 25.0, False),  # slower, but within the gate
    (WIDE, 1.2, 5.0, False),  # 20% slower by the medians, but within noise: 1.20 (0.78-1.80)
    (draws(8, 1000.0, 0.03, 8), 0.8, 5.0, False),  # faster
])
def test_the_regression_gate_fires_on_time_only_when_slower_beyond_the_threshold(official, shift, gate_pct, fails):
    nano, official = [2000.0, *(ms * shift for ms in reversed(official))], [2000.0, *official]
    verdict = build_comparison([timed("nano", nano), timed("official", official)], ["nano", "official"],
                               fail_on_regression=gate_pct)["verdict"]
    assert (verdict["exit_code"] == 1) is fails and bool(verdict["step_time_regressions"]) is fails
    if fails:
        assert verdict["step_time_regressions"][0].startswith("world_size=2 stage=2: step time nano / official 1.")


def test_the_printed_figures():
    assert step_times.median_and_quartiles({"step_ms": 812.34, "step_ms_q1": 790.1, "step_ms_q3": 840.25}, {}) == \
        "812.3 (790.1-840.2)"
    assert step_times.median_and_quartiles(None, {"step_ms": 10.0}) == "10.0"
    assert step_times.ratio_and_interval({"step_time_ratio": 0.9212, "step_time_ratio_low": 0.8801,
                                          "step_time_ratio_high": 0.9699}) == "0.92 (0.88-0.97)"
    assert step_times.ratio_and_interval({"step_time_ratio": 1.5}) == "1.50"
    assert step_times.rests_on({"steps": 38, "runs": 2}) == "38 steps, 2 runs"
