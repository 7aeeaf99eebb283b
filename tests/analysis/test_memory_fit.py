"""The preflight's rule (zero_lab/analysis/memory/memory_fit.py): fits, tight within 10% either side (the
prediction's own error), will not fit beyond, no verdict."""

from zero_lab.analysis.memory.memory_fit import Fit, fit, fit_line

GB = 2**30


def test_the_rule_at_its_boundaries():
    assert fit(100, 100) is Fit.TIGHT and fit(110, 100) is Fit.TIGHT and fit(111, 100) is Fit.WILL_NOT_FIT
    assert fit(90, 100) is Fit.FITS and fit(91, 100) is Fit.TIGHT
    assert fit(None, 100) is Fit.NO_VERDICT and fit(100, None) is Fit.NO_VERDICT


def test_the_line_gives_the_figures():
    assert fit_line("official w2 s2", 6.6 * GB, 2, 12 * GB, "--device-memory", Fit.WILL_NOT_FIT) == (
        "official w2 s2: will not fit: 2 ranks x 6.6 GB predicted peak = 13.2 GB, 12.0 GB offered (--device-memory)")
    assert fit_line("nano w1 s0", 300 * 2**20, 1, GB, "free memory of a GPU", Fit.FITS) == (
        "nano w1 s0: fits: 300 MB predicted peak per rank, 1.0 GB offered (free memory of a GPU)")
