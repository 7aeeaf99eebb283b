"""Will a run fit in memory? A predicted peak per rank against the memory the device offers.

The rule (`fit`): the memory a node's ranks need is the predicted peak of one rank
(`peak_memory.predict_peak`) times the ranks sharing one memory - every rank of the node on a CPU,
where they share the host's; one on a GPU, which each rank has to itself. Against what is offered:
  more than offered by over TIGHT_FRACTION (10%)  -> will not fit (run and compare refuse; --force goes on)
  within TIGHT_FRACTION of the offered, either side -> tight (a warning: it may or may not fit)
  otherwise                                        -> fits
  no prediction (a model whose architecture cannot be read) or nothing offered
  known -> no verdict.
The band is the prediction's own error: the resident prediction is held within 10% of what the ranks
measure (bench/peak_vs_predicted.py), so a run predicted just over the limit may fit, and only one
predicted beyond the band is refused as one that cannot.
"""

from __future__ import annotations

import enum

from zero_lab.workload.log_contract.log_lines import size_text

TIGHT_FRACTION = 0.10
# What lowers a rank's peak, in the CLI's own flags.
KNOBS = ("a higher --stage, --offload optimizer (or param at stage 3), a smaller --batch-size or --seq-len, "
         "or --gradient-checkpointing")


class Fit(enum.Enum):
    FITS = "fits"
    TIGHT = "tight"
    WILL_NOT_FIT = "will not fit"
    NO_VERDICT = "no verdict"


def fit(needed: float | None, offered: float | None) -> Fit:
    """The verdict for `needed` bytes against `offered` bytes (the module's rule)."""
    if needed is None or offered is None:
        return Fit.NO_VERDICT
    if needed > (1 + TIGHT_FRACTION) * offered:
        return Fit.WILL_NOT_FIT
    if needed > (1 - TIGHT_FRACTION) * offered:
        return Fit.TIGHT
    return Fit.FITS


def fit_line(label: str, peak_per_rank: float, ranks: int, offered: float, offered_name: str, verdict: Fit,
             measure: str = "predicted peak") -> str:
    """One line with the figures: `nano w2 s3: will not fit: 2 ranks x 6.6 GB predicted peak = 13.2 GB, ...`
    (`measure`: what the figure is, "predicted resident" on a CPU host)."""
    needed = f"{ranks} ranks x {size_text(peak_per_rank)} {measure} = {size_text(ranks * peak_per_rank)}" \
        if ranks > 1 else f"{size_text(peak_per_rank)} {measure} per rank"
    return f"{label}: {verdict.value}: {needed}, {size_text(offered)} offered ({offered_name})"
