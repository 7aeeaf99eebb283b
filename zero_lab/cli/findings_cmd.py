"""`zero-lab doctor PATH...`: the findings of runs and comparisons (`analysis.diagnosis`), printed.

    zero-lab doctor runs/compare-20260101-120000
    zero-lab doctor runs/20260101-120000-w2-s3-nano --format json

Phase 1: read and diagnose the directories (a path that is neither a run nor a comparison is bad
         input: one line, exit 2).
Phase 2: print each finding (errors first): its code and severity, title, evidence, cause and fix
         (a table where the evidence is one), or `{"findings": [...]}` with --format json.
Phase 3: exit 1 when a finding has severity error, else 0. `hint` is the one line `run` and
         `compare` print when the doctor would find something.
"""

from __future__ import annotations

from pathlib import Path

import typer

from zero_lab.cli import output
from zero_lab.cli.errors import BadInput

FORMATS = ("table", "json")


def findings_of(paths: list[Path]) -> list:
    """Phase 1."""
    from zero_lab.analysis.diagnosis import diagnose

    try:
        return diagnose(paths)
    except (ValueError, OSError) as error:
        raise BadInput(str(error)) from None


def plot_parting(paths: list[Path], picture: Path) -> None:
    """`--plot FILE`: the first run whose ranks' collectives part, drawn call by call up to where they
    part (`analysis.report.schedule_plot`); bad input when no run's records part."""
    from zero_lab.analysis.diagnosis.run_data import load
    from zero_lab.analysis.report.schedule_plot import plot_schedule

    try:
        runs, comparisons = load(paths)
    except (ValueError, OSError) as error:
        raise BadInput(str(error)) from None
    for run in [*runs, *(cell for comparison in comparisons for cell in comparison.runs)]:
        picture.parent.mkdir(parents=True, exist_ok=True)
        if plot_schedule(run.label, run.records, picture):
            output.stderr.print(f"wrote {picture}: the collectives of {run.name}, rank by rank", markup=False, highlight=False)
            return
    raise BadInput(f"--plot {picture}: no run given has ranks whose collectives part, so there is nothing to draw; "
                   "--plot draws a collective-mismatch (a run that failed with its ranks' flight records in logs/)")


def plural(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"


def print_findings(findings: list) -> None:
    """Phase 2, as text."""
    say = lambda text="": output.stdout.print(text, markup=False, highlight=False)  # noqa: E731
    for finding in findings:
        say(f"[{finding.severity}] {finding.code}: {finding.title}")
        for line in finding.evidence:
            say(f"    {line}")
        say(f"  cause: {finding.cause}")
        say(f"  fix: {finding.fix}")
        if finding.table:
            output.print_table(finding.table[0], finding.table[1:], numeric=False)
        say()
    counts = {severity: sum(finding.severity == severity for finding in findings) for severity in ("error", "warning", "info")}
    say(f"{plural(len(findings), 'finding')}: {plural(counts['error'], 'error')}, "
        f"{plural(counts['warning'], 'warning')}, {counts['info']} info")


def doctor_paths(paths: list[Path], format: str) -> None:
    """Phases 1-3."""
    from zero_lab.analysis.diagnosis import exit_code

    findings = findings_of(paths)
    if format == "json":
        output.print_json({"findings": [finding.to_json() for finding in findings]})
    else:
        print_findings(findings)
    raise typer.Exit(exit_code(findings))


def hint(directory: Path) -> None:
    """One line on stderr when the doctor finds something in `directory` (nothing when it cannot read it)."""
    try:
        findings = findings_of([directory])
    except BadInput:
        return
    if findings:
        kinds = sorted({finding.code for finding in findings})
        output.stderr.print(f"doctor: {plural(len(findings), 'finding')} ({', '.join(kinds)}): zero-lab doctor "
                            f"{directory}", markup=False, highlight=False)
