"""`zero-lab doctor PATH...`: why a run behaved as it did, answered from the run's own files.

Every finding is a pure function of what runs wrote (`run_data`): their summaries, rank 0's log,
their configs and each rank's flight record of collectives. Nothing is launched.

Phase 1: `run_data.load` reads the run and compare directories given.
Phase 2: each run alone: `mismatch` (collective-mismatch), `killed` (rank-killed), `memory` (out-of-memory, estimate-gap,
         buckets-dominate), `stage3` (stage3-everything-gathered, materialized-before-partition,
         no-16bit-weights-on-save), `restarts` (rank-restarted, restart-not-reproduced); then
         `failed` (run-failed) for a run that did not end well and no rule explained.
Phase 3: runs together (a comparison's cells; the run directories given, as one set):
         `comparison` (loss-divergence, dtype-difference).
Phase 4: errors first, then warnings, then facts (`finding.ordered`). docs/doctor.md tells each one.
"""

from __future__ import annotations

from pathlib import Path

from zero_lab.analysis.diagnosis import comparison, failed, killed, memory, mismatch, stage3
from zero_lab.analysis.diagnosis import restarts
from zero_lab.analysis.diagnosis.finding import Finding, exit_code, ordered
from zero_lab.analysis.diagnosis.run_data import RunData, load

__all__ = ["Finding", "diagnose", "exit_code", "run_findings"]

RUN_FINDINGS = (mismatch.collective_mismatch, killed.rank_killed, memory.out_of_memory, memory.estimate_gap, memory.buckets_dominate,
                stage3.everything_gathered, stage3.materialized_before_partition, stage3.no_16bit_weights_on_save,
                restarts.rank_restarted)


def run_findings(run: RunData) -> list[Finding]:
    """Phase 2 for one run; a run that did not end well and that no rule explains: `run-failed`."""
    found = [finding for examine in RUN_FINDINGS for finding in examine(run)]
    return found + failed.run_failed(run, found)


def diagnose(paths: list[Path]) -> list[Finding]:
    """Phases 1-4 for run and compare directories (a ValueError names a path that is neither)."""
    runs, comparisons = load(paths)
    findings = []
    for compared in comparisons:
        for run in compared.runs:
            findings += run_findings(run)
        verdict = compared.saved.get("verdict") or {}
        findings += comparison.comparison_findings(compared.runs, compared.saved.get("baseline"), verdict.get("loss_tol"))
    for run in runs:
        findings += run_findings(run)
    findings += comparison.comparison_findings(runs)
    return ordered(findings)
