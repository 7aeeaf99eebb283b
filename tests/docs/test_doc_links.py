"""Where a doc sends the reader to a section of another (`(docs/nano.md, "Config")`), that section is
there: a heading, or a paragraph's bold lead, that begins with the quoted words."""

from __future__ import annotations

import re

import pytest

from tests.docs.doc_text import DOCS, REPO, read

REFERENCE = re.compile(r'(docs/[\w-]+\.md|README\.md),? "([^"]+)"')


def sections(text: str) -> list[str]:
    """Every heading and every bold paragraph lead, backticks dropped."""
    headings = [re.sub(r"^#+\s*", "", line) for line in re.findall(r"^#+ .*$", text, flags=re.M)]
    leads = re.findall(r"^\*\*([^*]+)\*\*", text, flags=re.M)
    return [name.replace("`", "") for name in headings + leads]


REFERENCES = [(path.name, target, name) for path in DOCS for target, name in REFERENCE.findall(read(path))]


def test_the_docs_still_refer_to_sections():
    assert len(REFERENCES) >= 8, "the pattern finds the docs' section references (10 when written)"


@pytest.mark.parametrize("where, target, name", REFERENCES)
def test_every_section_a_doc_refers_to_exists(where, target, name):
    names = sections(read(REPO / target))
    assert any(section.startswith(name) for section in names), f"{where} refers to {target}, \"{name}\": not there"


IMAGE = re.compile(r"!\[[^\]]*\]\(([^)\s]+)\)")
PAGES = sorted([*REPO.glob("*.md"), *REPO.glob("docs/**/*.md"), *REPO.glob("reports/*.md")])


def test_every_picture_a_page_shows_is_committed():
    """A report or doc that links a PNG never committed shows a broken picture (three GPU reports did)."""
    linked = [(page.relative_to(REPO), target) for page in PAGES for target in IMAGE.findall(page.read_text())
              if not target.startswith(("http://", "https://"))]
    assert len(linked) >= 20, "the pattern finds the pages' pictures"
    missing = [f"{page}: {target}" for page, target in linked if not (REPO / page).parent.joinpath(target).is_file()]
    assert not missing, missing
