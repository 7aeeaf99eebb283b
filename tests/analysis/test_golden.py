"""compare.json, summary.json and the reports give the same values since their arithmetic moved
into pandas: a recorded comparison (tests/fixtures/compare-tiny, made by the code before) and edge
cases cut from it (tests/fixtures/golden, recorded by the code before), compared as JSON text, so
every key, its order, each value's type (3 is not 3.0) and NaN against null all count."""

import json

import pytest

from tests.analysis import golden_cases as cases
from zero_lab.analysis.report import version_lock
from zero_lab.analysis.compare.comparison import build_comparison
from zero_lab.analysis.runs.logparse import parse_file, parse_text
from zero_lab.analysis.report.markdown import render_report
from zero_lab.analysis.runs.tables import SUMMARY_COLUMNS, summarize_run
from zero_lab.cli.output import json_safe

CELLS = sorted(path.name for path in (cases.COMPARE_DIR / "cells").iterdir())


@pytest.fixture(autouse=True)
def no_lock(monkeypatch, tmp_path):
    """The recorded reports were rendered where no lock was read: their environment is compared
    with none here (tests/analysis/test_version_lock.py holds the note a lock adds)."""
    monkeypatch.setattr(version_lock, "LOCK_PATH", tmp_path / "no-constraints.txt")


def test_the_fixture_has_every_cell_of_the_comparison():
    assert CELLS == [f"w2-s{stage}-{impl}" for stage in (1, 2, 3) for impl in ("nano", "official")]


@pytest.mark.parametrize("cell", CELLS)
def test_a_run_summary_from_its_log_is_the_recorded_summary_json(cell):
    directory = cases.COMPARE_DIR / "cells" / cell
    recorded = json.loads((directory / "summary.json").read_text())
    measured = summarize_run(parse_file(directory / "logs" / "rank0.stdout.log"))
    assert json.dumps(measured) == json.dumps({name: recorded[name] for name in SUMMARY_COLUMNS})


def test_summaries_of_edge_logs_are_as_recorded():
    golden = (cases.GOLDEN / "edge-summaries.json").read_text()
    summaries = {name: summarize_run(parse_text(text)) for name, text in cases.EDGE_LOGS.items()}
    assert json.dumps(summaries, indent=1) + "\n" == golden


def test_the_comparison_is_the_recorded_compare_json():
    recorded = json.loads((cases.COMPARE_DIR / "compare.json").read_text())
    comparison = json_safe(build_comparison(cases.recorded_summaries(), cases.IMPLS))
    for key in ("rows", "deltas", "verdict"):
        assert json.dumps(comparison[key]) == json.dumps(recorded[key]), key


def test_the_report_is_the_recorded_report():
    summaries = cases.recorded_summaries()
    text = render_report(build_comparison(summaries, cases.IMPLS), summaries, cases.TITLE, cases.PLOTS)
    assert text == (cases.COMPARE_DIR / "report.md").read_text()


def test_an_edge_comparison_and_its_report_are_as_recorded():
    summaries = cases.edge_summaries()
    comparison = build_comparison(summaries, cases.IMPLS, fail_on_regression=1.0, resumed=cases.resumed_runs())
    assert json.dumps(comparison, indent=1) + "\n" == (cases.GOLDEN / "edge-comparison.json").read_text()
    assert render_report(comparison, summaries, cases.TITLE, []) == (cases.GOLDEN / "edge-report.md").read_text()
