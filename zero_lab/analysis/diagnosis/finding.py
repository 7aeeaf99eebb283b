"""One answer of `zero-lab doctor RUN_DIR`: a finding, its code and severity, and the JSON it prints.

The codes and severities are a contract (docs/doctor.md):
    info     a fact of this configuration worth knowing;
    warning  likely unintended;
    error    the run failed, or two runs parted.
`zero-lab doctor PATH...` exits 0 when no finding has severity error, 1 otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass, field

INFO, WARNING, ERROR = "info", "warning", "error"
SEVERITY_OF = {
    "stage3-everything-gathered": INFO,
    "buckets-dominate": INFO,
    "dtype-difference": INFO,
    "rank-restarted": INFO,
    "restart-not-reproduced": WARNING,
    "estimate-gap": WARNING,
    "materialized-before-partition": WARNING,
    "no-16bit-weights-on-save": WARNING,
    "collective-mismatch": ERROR,
    "rank-killed": ERROR,
    "run-failed": ERROR,
    "loss-divergence": ERROR,
    "out-of-memory": ERROR,
}
SEVERITIES = (ERROR, WARNING, INFO)  # the order findings are printed in


@dataclass
class Finding:
    """What the doctor found: a title, the evidence (the run's own figures, one line each), the cause
    in one sentence, the fix with its predicted effect where it can be computed; `runs` are the
    directories it is about, `figures` the numbers behind the evidence, `table` rows where the
    evidence is a table (its first row the header)."""

    code: str
    title: str
    evidence: list[str]
    cause: str
    fix: str
    runs: list[str] = field(default_factory=list)
    figures: dict = field(default_factory=dict)
    table: list[list[str]] = field(default_factory=list)

    @property
    def severity(self) -> str:
        return SEVERITY_OF[self.code]

    def to_json(self) -> dict:
        """One element of `--format json`'s `findings`."""
        found = {"code": self.code, "severity": self.severity, "title": self.title, "evidence": self.evidence,
                 "cause": self.cause, "fix": self.fix, "runs": self.runs, "figures": self.figures}
        if self.table:
            found["table"] = self.table
        return found


def ordered(findings: list[Finding]) -> list[Finding]:
    """Errors first, then warnings, then facts; in the order found within a severity."""
    return sorted(findings, key=lambda finding: SEVERITIES.index(finding.severity))


def exit_code(findings: list[Finding]) -> int:
    """0 without a finding of severity error, 1 with one."""
    return 1 if any(finding.severity == ERROR for finding in findings) else 0


def mb(size: float | None) -> str:
    """Bytes in MB (2^20), for evidence lines."""
    return "?" if size is None else f"{size / 2**20:.1f} MB"
