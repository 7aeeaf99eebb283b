"""docs/analysis.md runs as written: its python blocks, in order and in one namespace, against the
recorded comparison (tests/fixtures/compare-tiny) placed where `make demo` puts one."""

import re
import shutil
from pathlib import Path

from tests.analysis import golden_cases as cases

DOC = Path(__file__).resolve().parents[2] / "docs" / "analysis.md"


def python_blocks(text: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", text, flags=re.DOTALL)


def test_every_python_block_of_docs_analysis_runs(tmp_path, monkeypatch, capsys):
    blocks = python_blocks(DOC.read_text())
    assert len(blocks) >= 4, "loading, a groupby over stages, the loss step by step, a plot of memory by stage"
    shutil.copytree(cases.COMPARE_DIR, tmp_path / "runs" / "compare-20260101-120000")
    monkeypatch.chdir(tmp_path)
    namespace = {}
    for block in blocks:
        exec(compile(block, str(DOC), "exec"), namespace)
    by_stage = namespace["by_stage"]
    assert by_stage.loc[("nano", 2), "loss_last"] == next(
        s["loss_last"] for s in cases.recorded_summaries() if (s["impl"], s["stage"]) == ("nano", 2))
    assert len(by_stage) == 6 and by_stage["step_ms"].notna().all()
    assert namespace["memory"].shape == (3, 2), "three stages, two impls"
    assert (tmp_path / "memory-by-stage.png").stat().st_size > 0
    printed = capsys.readouterr().out
    assert "official" in printed and "after_step" in printed
