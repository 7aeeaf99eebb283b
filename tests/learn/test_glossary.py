"""The course's glossary (docs/learn/glossary.md and its Chinese twin): the same terms in both, each in
the lesson the glossary says first defines it, and the Chinese lessons and README write each term the
glossary's way and none of its rejected variants (code, commands, link targets, formulas and an English original
in full-width parentheses aside)."""

from __future__ import annotations

import re

import pytest

from tests.learn.course import CHINESE, LEARN, LESSONS, prose, read

ENGLISH_GLOSSARY, CHINESE_GLOSSARY = LEARN / "glossary.md", CHINESE / "glossary.md"


def rows(path) -> list[list[str]]:
    """The glossary's table, a list of cells per term (header and rule left out)."""
    lines = [line for line in read(path).splitlines() if line.startswith("| ")]
    return [[cell.strip() for cell in line.strip("|").split("|")] for line in lines[1:]]


def linked_lesson(cell: str, chinese: bool):
    target = re.search(r"\]\(([\w-]+\.md)\)", cell)[1]
    return (CHINESE if chinese else LEARN) / target


def chinese_prose(text: str) -> str:
    """The running text of a Chinese lesson: `prose`, less indented formulas and （English） glosses."""
    kept = [line for line in prose(text).splitlines() if not line.startswith("    ")]
    return re.sub(r"（[^）]*）", " ", "\n".join(kept))


def rejected(cell: str) -> list[str]:
    return [variant.strip() for variant in cell.split("、") if variant.strip()]


def test_both_glossaries_list_the_same_terms_first_defined_in_the_same_lessons():
    english, chinese = rows(ENGLISH_GLOSSARY), rows(CHINESE_GLOSSARY)
    assert len(english) >= 10
    assert [row[0] for row in english] == [row[0] for row in chinese]
    assert [linked_lesson(row[-1], False).name for row in english] == [linked_lesson(row[-1], True).name for row in chinese]


@pytest.mark.parametrize("term, rendering, lesson_cell", [(row[0], row[1], row[-1]) for row in rows(CHINESE_GLOSSARY)])
def test_each_term_is_in_the_lesson_that_first_defines_it_and_none_before(term, rendering, lesson_cell):
    first = linked_lesson(lesson_cell, False)
    assert term.lower() in read(first).lower(), f"{first.name} does not use {term!r}"
    chinese_term = re.split(r"[、（]", rendering)[0]
    assert chinese_term in read(CHINESE / first.name), f"zh/{first.name} does not write {chinese_term!r}"
    earlier = LESSONS[:LESSONS.index(first)]
    assert not [path.name for path in earlier if re.search(rf"\*\*{re.escape(term)}\*\*", read(path), re.I)], \
        f"{term!r} is defined (in bold) before {first.name}"


@pytest.mark.parametrize("path", [*sorted(CHINESE.glob("*.md")), LEARN.parents[1] / "README.zh-CN.md"],
                         ids=lambda path: path.name)
def test_the_chinese_lesson_writes_each_term_the_glossarys_way(path):
    if path.name == CHINESE_GLOSSARY.name:
        return
    text = chinese_prose(read(path))
    found = []
    for row in rows(CHINESE_GLOSSARY):
        for variant in rejected(row[2]):
            # an English word stands between non-letters (a Chinese character is a \w to `\b`)
            pattern = rf"(?<![A-Za-z]){re.escape(variant)}(?![A-Za-z])" if variant.isascii() else re.escape(variant)
            found += [f"{variant!r} (write {row[1]!r})" for _ in re.finditer(pattern, text, flags=re.I)]
    assert not found, found
