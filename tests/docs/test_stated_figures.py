"""Figures the docs state in running text, each against what it describes: the committed demo report
(`make demo`'s reports/cpu-demo.md), the run logs, the engine's formula."""

from __future__ import annotations

import re

from tests.docs.doc_text import REPO, read, table_after

DEMO = read(REPO / "reports" / "cpu-demo.md")


def demo_cell(stage: int) -> dict[str, list[str]]:
    """The demo's nano-vs-official table at world size 2 and `stage`: metric -> its cells."""
    rows = table_after(DEMO, f"## world size 2, stage {stage}: nano vs official")
    return {row[0]: row[1:] for row in rows[1:]}


def test_compare_json_states_the_demos_stage_3_wire_ratio():
    row = next(line for line in read(REPO / "docs" / "compare-json.md").splitlines() if line.startswith("| `comm_wire_ratio`"))
    ratio, per_step = re.search(r"the ratio is ([\d.]+) with the harness's zero3.json .*?([\d.]+) wire MB per step each", row).groups()
    wire = demo_cell(3)["wire MB / step"]
    assert (wire[0], wire[1], wire[3]) == (per_step, per_step, f"ratio {ratio}"), wire
    for stage in (1, 2):
        assert demo_cell(stage)["wire MB / step"][3] == "ratio 0.667", "about 2/3 at stages 1 and 2"


def test_the_stages_nano_md_says_predivide_are_the_stage_tables():
    from zero_lab.nano import stages

    sentence = " ".join(read(REPO / "docs" / "nano.md").split())
    named = re.search(r"A reduce-scattered bucket is divided by N before the sum at stages ([\d, and]+), as", sentence)[1]
    assert {int(number) for number in re.findall(r"\d", named)} == {
        number for number, row in stages.BY_NUMBER.items() if row.predivides}
