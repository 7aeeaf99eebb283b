"""Every "as official does" sentence of the docs names a test beside it that runs official DeepSpeed.

A sentence of that kind is one the pattern below finds in a block (a paragraph, a list item or a
table row of README.md or docs/*.md): "as official", "as in official", "as with official", "as
DeepSpeed does", "as in DeepSpeed", "as official's ... does". Its block must cite a test as
`tests/<file>.py::<test>` that pytest collects with the `official` marker (docs/cli.md: needs
official DeepSpeed), so the claim is checked by running official, not by reading it.
"""

from __future__ import annotations

import re
import subprocess
import sys

from tests.docs.doc_text import ENGLISH_DOCS, REPO, blocks, read

CLAIM = re.compile(r"\bas (?:in |with )?(?:official|DeepSpeed)\b|\bas official's [\w/ -]{0,40}?(?:does|do)\b"
                   r"|\bas DeepSpeed (?:does|reports)\b", re.I)
CITED = re.compile(r"tests/[\w/]+\.py::\w+")


def claims() -> list[tuple[str, str, list[str]]]:
    """(file, block, cited tests) for every block with an "as official does" sentence."""
    return [(path.name, block, CITED.findall(block)) for path in ENGLISH_DOCS for block in blocks(read(path))
            if CLAIM.search(block)]


def official_tests(files: set[str]) -> set[str]:
    """Node ids (file::function) pytest collects with the official marker from these files."""
    existing = sorted(name for name in files if (REPO / name).is_file())
    done = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-m", "official", *existing],
                          cwd=REPO, capture_output=True, text=True, timeout=600)
    return {re.sub(r"\[.*\]$", "", line.strip()) for line in done.stdout.splitlines() if "::" in line}


def test_every_as_official_sentence_cites_a_test_that_runs_official():
    found = claims()
    assert len(found) >= 8, "the pattern still finds the docs' claims (9 when written)"
    official = official_tests({test.split("::")[0] for _, _, cited in found for test in cited})
    assert official, "pytest collected the official tests"
    uncited = [f"{name}: {block[:120]}" for name, block, cited in found if not cited]
    assert not uncited, "a claim about official without a test beside it:\n" + "\n".join(uncited)
    not_official = [f"{name}: {test}" for name, _, cited in found for test in cited if test not in official]
    assert not not_official, "cited tests that do not exist or do not run official:\n" + "\n".join(not_official)
