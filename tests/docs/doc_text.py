"""Reading the docs as the tests need them: the files, their blocks (a paragraph, a list item or a table
row, code left out), their tables and their `zero-lab` commands."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DOCS = [REPO / "README.md", REPO / "README.zh-CN.md", *sorted((REPO / "docs").glob("*.md"))]
ENGLISH_DOCS = [path for path in DOCS if path.name != "README.zh-CN.md"]


def read(path: Path) -> str:
    return path.read_text(encoding="utf-8")


def without_code(text: str) -> str:
    return re.sub(r"```.*?```", "", text, flags=re.S)


def blocks(text: str) -> list[str]:
    """Paragraphs, list items and table rows, each as one line, code blocks left out."""
    found, current = [], []
    for line in without_code(text).splitlines():
        starts_item = re.match(r"\s*(?:[-*]|\d+\.) ", line)
        if line.startswith("|") or not line.strip() or starts_item:
            if current:
                found.append(" ".join(current))
                current = []
            if line.startswith("|"):
                found.append(line)
                continue
        if line.strip():
            current.append(line.strip())
    if current:
        found.append(" ".join(current))
    return found


def table_after(text: str, heading_words: str) -> list[list[str]]:
    """The cells of the first markdown table after the line holding heading_words (header row included)."""
    lines = text[text.index(heading_words):].splitlines()
    rows, started = [], False
    for line in lines[1:]:
        if line.startswith("|"):
            started = True
            if not re.match(r"^\|[\s|:-]+\|$", line):
                rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
        elif started:
            break
    return rows


def code_commands(text: str) -> list[list[str]]:
    """Every `zero-lab ...` command of the bash code blocks, as argv after `zero-lab` (comments cut,
    continuation lines joined)."""
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S):
        joined = re.sub(r"\\\n\s*", " ", block)
        for line in joined.splitlines():
            line = line.split(" #")[0].strip()
            if line.startswith("zero-lab ") or line.startswith(".venv/bin/zero-lab "):
                commands.append(shlex.split(line)[1:])
    return commands
