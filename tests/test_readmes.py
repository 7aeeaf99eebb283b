"""README.md and README.zh-CN.md stay in step: each links the other, the same sections in the same
order, the same two set-up commands and the same command block, the users' own terms kept."""

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ENGLISH, CHINESE = ((REPO / name).read_text(encoding="utf-8") for name in ("README.md", "README.zh-CN.md"))


def code_blocks(text: str) -> list[str]:
    return re.findall(r"```(?:bash|python)\n(.*?)```", text, flags=re.S)


def test_each_readme_links_the_other():
    assert "(README.zh-CN.md)" in ENGLISH and "(README.md)" in CHINESE


def test_same_sections_in_the_same_order():
    def sections(text: str) -> list[str]:
        return re.findall(r"^## ", text, flags=re.M)

    assert len(sections(ENGLISH)) == len(sections(CHINESE)) >= 4
    # Each Chinese section sits where its English one does: the same code blocks between headings.
    def blocks_per_section(text: str) -> list[int]:
        return [len(code_blocks(part)) for part in re.split(r"^## ", text, flags=re.M)]

    assert blocks_per_section(ENGLISH) == blocks_per_section(CHINESE)


def test_same_commands():
    assert code_blocks(ENGLISH) == code_blocks(CHINESE)
    setup = code_blocks(ENGLISH)[0]
    assert [line.split("#")[0].strip() for line in setup.splitlines() if line.startswith("make")] == ["make demo", "make test"]


def test_terms_stay_as_users_know_them():
    for term in ("ZeRO", "all-gather", "offload", "stage 3"):
        assert term in CHINESE


def layout_rows(text: str) -> list[tuple[str, ...]]:
    """Each row of the layout table as its backticked paths and file names, in order."""
    table = text.split("\n## ")[[heading.split("\n")[0] for heading in text.split("\n## ")].index(
        "Layout" if "## Layout" in text else "目录结构")]
    return [tuple(re.findall(r"`([\w./|-]+)`", line)) for line in table.splitlines() if line.startswith("| `")]


def test_the_layout_tables_name_the_same_paths_row_for_row():
    english, chinese = layout_rows(ENGLISH), layout_rows(CHINESE)
    assert len(english) >= 8 and english == chinese, [pair for pair in zip(english, chinese) if pair[0] != pair[1]]


def test_every_path_the_layout_names_exists():
    ignored = (REPO / ".gitignore").read_text().split()
    for folder, *names in layout_rows(ENGLISH):
        assert (REPO / folder).exists() or folder in ignored or f"/{folder}" in ignored, f"no {folder} here"
        for name in names:
            if name.endswith(".py") and "/" not in name:
                assert (REPO / folder / name).is_file(), f"the layout names {folder}{name}, which is not here"


def test_the_layout_names_every_part_of_the_package():
    named = {name for row in layout_rows(ENGLISH) for name in row}
    parts = {f"zero_lab/{path.name}/" if path.is_dir() else f"zero_lab/{path.name}"
             for path in (REPO / "zero_lab").iterdir()
             if path.name not in ("__init__.py", "__pycache__") and (path.suffix == ".py" or (path / "__init__.py").is_file()
                                                                  or path.is_dir() and any(path.rglob("*.py")))}
    assert parts <= named, f"the README's layout leaves out {parts - named}"
