"""Step times with their noise: which steps are start-up, an impl's median and spread, and how sure
a ratio of two impls' step times is.

A *step time* is one `[opt_step]` line's `step_ms`. On a shared machine the same run, repeated,
reads differently by 10% or more, so a ratio of two medians is a measurement with an error, not a
result. This module gives it one, from the per-step times alone (no launch, no clock):

Phase 1: `start_up_steps`: how many leading steps of one run (K) carry start-up work and are left
         out: step 1 always, then each following step while it stays above the run's steady
         state (Tukey's upper fence of the run's later half).
Phase 2: `steady_times`: a run's times without those K steps. An impl's runs of one cell
         (`compare --repeat`) are pooled by the caller.
Phase 3: `spread`: the median of the pooled times and their quartiles (the interquartile range).
Phase 4: `ratio_interval`: a bootstrap 95% interval for median(candidate) / median(baseline):
         resample each impl's runs, then each drawn run's steps, with replacement; take the ratio
         of the medians, 2000 times, and keep the middle 95% of the ratios. Seeded, so the same
         times give the same interval. With one run per impl the interval knows the noise between
         its steps only; a whole run slowed by a busy machine it cannot see: several runs
         (`--repeat`) show that noise too.
Phase 5: `time_verdict`: `faster` or `slower` only when the interval excludes 1.0, else
         `within noise`.
How the tables print them: `median_and_quartiles` (`812.3 (790.1-840.2)`), `ratio_and_interval`
(`0.92 (0.88-0.97)`), `rests_on` (`38 steps, 2 runs`); `READING` says so above a report's tables.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

# A run needs this many steps before steps after the first can count as start-up: two to form the
# later half that defines the steady state, and one earlier step to judge against it.
FEWEST_FOR_TRANSIENT = 4
# Tukey's fence: Q3 + 1.5 x IQR, the conventional "outside the bulk" bound of a box plot.
FENCE_IQRS = 1.5
# A ratio gets an interval only when each impl has at least this many steady steps: a bootstrap of
# one or two values says nothing about their noise.
FEWEST_FOR_INTERVAL = 3
CONFIDENCE = 0.95
RESAMPLES = 2000
SEED = 0


def start_up_steps(times: Sequence[float]) -> int:
    """Phase 1: K, the number of leading steps of one run that are start-up work.

    - a run of one step keeps it (K = 0): it is the only measurement there is;
    - otherwise step 1 is always start-up (first-touch allocations, caches, JIT builds);
    - with at least FEWEST_FOR_TRANSIENT steps, the *later half* (the last floor(n/2) steps) is the
      steady state, and steps 2, 3, ... of the earlier half are start-up too while each one is above
      that half's upper fence, Q3 + 1.5 x IQR; the first step at or below it ends the start-up.
    So K never exceeds ceil(n/2): at least the later half is always measured.
    """
    count = len(times)
    if count <= 1:
        return 0
    if count < FEWEST_FOR_TRANSIENT:
        return 1
    later = np.asarray(times[count - count // 2:], dtype=float)
    first_quartile, third_quartile = np.percentile(later, [25, 75])
    fence = third_quartile + FENCE_IQRS * (third_quartile - first_quartile)
    start_up = 1
    while start_up < count - count // 2 and times[start_up] > fence:
        start_up += 1
    return start_up


def steady_times(times: Sequence[float]) -> list[float]:
    """Phase 2: one run's step times in step order, its start-up steps left out."""
    return list(times[start_up_steps(times):])


@dataclass(frozen=True)
class Spread:
    """Phase 3: the median step time and its quartiles (the IQR is q3 - q1), over `steps` times."""

    median: float
    q1: float
    q3: float
    steps: int


def spread(times: Sequence[float]) -> Spread | None:
    """The median and quartiles of some step times (None without any)."""
    if not len(times):
        return None
    first_quartile, median, third_quartile = np.percentile(np.asarray(times, dtype=float), [25, 50, 75])
    return Spread(float(median), float(first_quartile), float(third_quartile), len(times))


def resampled_medians(runs: Sequence[Sequence[float]], resamples: int, generator: np.random.Generator) -> np.ndarray:
    """`resamples` bootstrap medians of one impl's steady times, in two levels: draw as many runs as
    it has, with replacement, then each drawn run's steps, with replacement, and pool them. Steps of
    one run share its conditions (the machine's load while it ran, where its memory landed), so with
    several runs the medians vary as much as the runs do; with one run, as much as its steps do."""
    arrays = [np.asarray(run, dtype=float) for run in runs if len(run)]
    if len(arrays) == 1:
        return np.median(generator.choice(arrays[0], size=(resamples, arrays[0].size)), axis=1)
    medians = np.empty(resamples)
    for index in range(resamples):
        drawn = generator.integers(0, len(arrays), len(arrays))
        medians[index] = np.median(np.concatenate([generator.choice(arrays[run], arrays[run].size) for run in drawn]))
    return medians


def ratio_interval(candidate: Sequence[Sequence[float]], baseline: Sequence[Sequence[float]],
                   confidence: float = CONFIDENCE, resamples: int = RESAMPLES,
                   seed: int = SEED) -> tuple[float, float] | None:
    """Phase 4: (low, high), the percentile bootstrap interval of median(candidate) / median(baseline),
    each impl's steady times given per run (`compare --repeat`: several).

    Each resample takes the ratio of the two impls' `resampled_medians`; the interval is the middle
    `confidence` of the `resamples` ratios. None when either impl has fewer than FEWEST_FOR_INTERVAL
    steady steps, or a resampled baseline median can be 0.
    """
    if min(sum(len(run) for run in candidate), sum(len(run) for run in baseline)) < FEWEST_FOR_INTERVAL:
        return None
    generator = np.random.default_rng(seed)
    candidate_medians = resampled_medians(candidate, resamples, generator)
    baseline_medians = resampled_medians(baseline, resamples, generator)
    if (baseline_medians <= 0).any():
        return None
    tail = 100 * (1 - confidence) / 2
    low, high = np.percentile(candidate_medians / baseline_medians, [tail, 100 - tail])
    return float(low), float(high)


def time_verdict(interval: tuple[float, float] | None) -> str | None:
    """Phase 5: `faster` (the whole interval below 1.0), `slower` (above), else `within noise`;
    None without an interval."""
    if interval is None:
        return None
    low, high = interval
    return "faster" if high < 1.0 else "slower" if low > 1.0 else "within noise"


# How to read a step time, above the tables of a report.
READING = (
    "Step time is noisy, so each figure comes with its spread: `step ms` is the median over the steps after "
    "start-up (step 1, and more while the times stay above the run's steady state), an impl's runs pooled "
    "(`--repeat`), with the interquartile range in brackets; the ratio's bracket is its bootstrap 95% interval: "
    "`faster` or `slower` only when that interval excludes 1.0, else `within noise`. Memory and wire bytes are "
    "exact counts and need no interval (docs/compare-json.md).")


def median_and_quartiles(timed: dict | None, row: dict) -> str:
    """`812.3 (790.1-840.2)`: an impl's median step ms (compare.json's `step_times` entry) and its
    quartiles; without per-step times, its run's own step ms (`-` for none)."""
    if not timed or timed.get("step_ms_q1") is None:
        median = (timed or row).get("step_ms")
        return "-" if median is None else f"{median:.1f}"
    return f"{timed['step_ms']:.1f} ({timed['step_ms_q1']:.1f}-{timed['step_ms_q3']:.1f})"


def ratio_and_interval(delta: dict) -> str:
    """`0.92 (0.88-0.97)`: a delta's step-time ratio and its 95% interval (the ratio alone without one)."""
    ratio, low, high = delta.get("step_time_ratio"), delta.get("step_time_ratio_low"), delta.get("step_time_ratio_high")
    if ratio is None:
        return "-"
    return f"{ratio:.2f}" + (f" ({low:.2f}-{high:.2f})" if low is not None and high is not None else "")


def rests_on(timed: dict | None) -> str:
    """What an impl's step time rests on: `38 steps, 2 runs` (`-` without per-step times)."""
    if not timed or not timed.get("steps"):
        return "-"
    runs = timed["runs"]
    return f"{timed['steps']} steps, {runs} run{'s' if runs != 1 else ''}"
