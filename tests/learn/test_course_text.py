"""The course's shape, without running anything: twelve lessons in order, each with its idea, picture,
command, Try it and answer; the index naming them in that order; the Chinese twins saying the same
(same commands, excerpts, pictures and numbers); every link and section a lesson points to there;
each Try it config one key away from the config it changes; the README sending a newcomer to lesson 0."""

from __future__ import annotations

import json
import re

import pytest

from tests.docs.test_doc_links import sections
from tests.learn.course import (CHINESE, LEARN, LESSONS, REPO, fenced, lesson, pictures, read, shown_commands,
                                stated_numbers)

TITLES = ["first comparison", "data parallelism", "zero-1", "zero-2", "zero-3", "precision", "offload", "zero++",
          "fsdp2", "checkpoints", "when a run goes wrong", "a step in time"]
NUMBERS = range(12)


def test_twelve_lessons_in_the_issues_order():
    assert [path.name.split("-")[0] for path in LESSONS] == [str(number) for number in NUMBERS]
    for path, title in zip(LESSONS, TITLES):
        assert title in read(path).splitlines()[0].lower(), (path.name, title)


def test_the_index_lists_every_lesson_in_order_with_what_it_teaches():
    index = read(LEARN / "README.md")
    linked = re.findall(r"^\| \[(\d+)\. [^\]]+\]\(([\w-]+\.md)\) \| .{20,}\|$", index, flags=re.M)
    assert linked == [(str(number), path.name) for number, path in zip(NUMBERS, LESSONS)]


@pytest.mark.parametrize("number", NUMBERS)
def test_each_lesson_has_its_parts(number):
    text = read(lesson(number))
    headings = re.findall(r"^## (.+)$", text, flags=re.M)
    for part in ("The idea", "Run it", "The picture", "Try it"):
        assert part in headings, f"lesson {number} has no '## {part}'"
    assert len(pictures(text)) == 1, "one picture per lesson"
    commands = shown_commands(text)
    assert any(shown.section == "Run it" and shown.excerpt for shown in commands), "a command with its output"
    tried = [shown for shown in commands if shown.section == "Try it"]
    assert tried, "Try it runs a command"
    answer = text.split("## Try it")[1]
    assert "<details>" in answer and "</details>" in answer and "<summary>" in answer, "the answer is folded"


@pytest.mark.parametrize("number", NUMBERS)
def test_the_chinese_lesson_says_the_same(number):
    english, chinese = read(lesson(number)), read(lesson(number, chinese=True))
    code = [(language, body) for language, body, _ in fenced(english)]
    assert [(language, body) for language, body, _ in fenced(chinese)] == code, "the same commands and excerpts"
    assert pictures(chinese) == [f"../{picture}" for picture in pictures(english)], "the same pictures"
    assert stated_numbers(chinese) == stated_numbers(english), "the same numbers"
    assert chinese.count("<details>") == english.count("<details>")
    assert len(re.findall(r"^## ", chinese, flags=re.M)) == len(re.findall(r"^## ", english, flags=re.M))


def test_the_chinese_index_lists_the_same_lessons():
    english, chinese = read(LEARN / "README.md"), read(CHINESE / "README.md")
    assert re.findall(r"\]\(([\w-]+\.md)\)", chinese)[:12] == re.findall(r"\]\(([\w-]+\.md)\)", english)[:12]
    assert "(../README.md)" in chinese and "(zh/README.md)" in english


def links(path):
    return [(target.split("#")[0], path) for target in re.findall(r"\]\(([^)#][^)]*)\)", read(path))
            if not target.startswith("http")]


@pytest.mark.parametrize("path", [LEARN / "README.md", CHINESE / "README.md", *LESSONS,
                                  *[CHINESE / path.name for path in LESSONS]], ids=lambda path: path.name)
def test_every_link_and_section_a_page_names_is_there(path):
    for target, _ in links(path):
        assert (path.parent / target).resolve().exists(), f"{path.name} links {target}, which is not there"
    for target, name in re.findall(r"\]\(([\w./-]+\.md)\), \"([^\"]+)\"", read(path)):
        named = sections(read((path.parent / target).resolve()))
        assert any(section.startswith(name.replace("`", "")) for section in named), \
            f"{path.name} sends the reader to {target}, \"{name}\": not there"


def configs_shown() -> list[str]:
    return sorted({word for path in LESSONS for shown in shown_commands(read(path))
                   for word in shown.command.split() if word.startswith("docs/learn/configs/")})


def zero_keys(path) -> dict:
    return json.loads((REPO / path).read_text())["zero_optimization"]


def test_each_try_it_config_is_one_key_away_from_the_config_it_changes():
    base = {"docs/learn/configs/zero3-prefetch-0.json": "harness/configs/zero3.json",
            "docs/learn/configs/zero3-max-live-2e8.json": "harness/configs/zero3.json",
            "docs/learn/configs/zeropp-hpz.json": "docs/learn/configs/zero3-prefetch-0.json",
            "docs/learn/configs/zero3-prefetch-0-reuse-1e9.json": "docs/learn/configs/zero3-prefetch-0.json"}
    assert set(base) <= set(configs_shown())
    for config, changes in base.items():
        mine, theirs = zero_keys(config), zero_keys(changes)
        changed = {key for key in mine.keys() | theirs.keys() if mine.get(key) != theirs.get(key)}
        assert len(changed) == 1, f"{config} changes {changed} of {changes}"
        assert json.loads((REPO / config).read_text()) | {"zero_optimization": theirs} == \
            json.loads((REPO / changes).read_text()), f"{config} changes more than zero_optimization"
    all_three = zero_keys("docs/learn/configs/zeropp-all.json")
    assert all_three == zero_keys("docs/learn/configs/zeropp-hpz.json") | {
        "zero_quantized_weights": True, "zero_quantized_gradients": True}


@pytest.mark.parametrize("readme, lesson_0", [("README.md", "docs/learn/0-first-comparison.md"),
                                              ("README.zh-CN.md", "docs/learn/zh/0-first-comparison.md")])
def test_the_readme_sends_a_newcomer_to_lesson_0_before_anything_else(readme, lesson_0):
    text = read(REPO / readme)
    assert f"({lesson_0})" in text.split("\n## ")[0], "before the first section"
    use = text.split("```bash")[2].split("```")[0]  # the Use block: the README's second
    commands = [line for line in use.splitlines() if line.startswith("zero-lab")]
    assert commands[0].startswith("zero-lab explain"), "explain opens the Use list"


def test_every_picture_of_the_course_is_in_a_lesson():
    shown = {picture for path in LESSONS for picture in pictures(read(path))}
    assert {f"img/{path.name}" for path in (LEARN / "img").glob("*.png")} == shown
