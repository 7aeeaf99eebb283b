"""The doctor's corpus (bench/doctor_corpus.py), a fast part of it run here: a healthy traced run, a
script that raises, the launcher's agent killed and `zero-lab run` itself killed, each diagnosed as
the bench diagnoses it; and docs/doctor.md's table, held to the bench's cases."""

from __future__ import annotations

import pytest

from tests.leftovers import leftovers_killed  # noqa: F401 (autouse: each test kills what it leaves)
from tests.scripts import REPO, load_script

corpus = load_script("bench/doctor_corpus.py", "doctor_corpus")
FAST = ("traced stage 3, nano", "a script that raises", "the launcher's agent killed", "zero-lab run itself killed")


def case_named(name: str):
    return next(case for case in corpus.healthy_cases() + corpus.fault_cases() if case.name == name)


@pytest.mark.slow
@pytest.mark.parametrize("name", FAST)
def test_the_doctor_finds_the_known_cause(name, tmp_path):
    case = case_named(name)
    case.directories = case.make(tmp_path)
    row = corpus.diagnose(case)
    assert row["right"] and not row["traceback"], row


def test_docs_doctor_md_shows_every_case_of_the_corpus_and_the_goal():
    text = (REPO / "docs" / "doctor.md").read_text()
    section = text.split("## The doctor's corpus")[1].split("\n## ")[0]
    rows = [[cell.strip() for cell in line.strip("|").split("|")] for line in section.splitlines()
            if line.startswith("| ") and not line.startswith("| case |")]
    cases = corpus.healthy_cases() + corpus.fault_cases()
    assert [(row[0], row[2]) for row in rows] == [(case.name, case.expected or "no error or warning") for case in cases]
    assert all(row[4] == "yes" for row in rows), [row for row in rows if row[4] != "yes"]
    healthy = sum(int(row[1]) for row, case in zip(rows, cases) if case.expected is None)
    assert healthy >= 30 and f"{healthy} healthy runs" in section
