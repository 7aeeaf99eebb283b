"""docs/zeropp.md's bytes against `zero-lab explain`, which the harness's measurement equals
(tests/zeropp/test_zeropp_bytes.py): every cell of the three bytes tables (inter- and intra-node wire
bytes of one steady step of one rank, each M figure and each ratio), and the bf16 figures and model
sizes the text around them states. Pure arithmetic, nothing launched: a table cannot go stale."""

from __future__ import annotations

import functools
import json
import re

import pytest
from typer.testing import CliRunner

from tests.docs.doc_text import REPO, read, table_after
from zero_lab.cli.app import app

ZEROPP_MD = read(REPO / "docs" / "zeropp.md")
ZEROPP_TEXT = " ".join(ZEROPP_MD.split())  # its sentences, unwrapped
# Each table, by the words of the line before it.
TABLES = ("## The bytes (fp32", "With qwZ (same config", "With qgZ (same config")
HPZ = "hpZ's partition size: K"  # the tables' hpZ partitions within the node
KEYS = {"stage3": {}, "hpz": {"zero_hpz_partition_size": HPZ}, "qwz": {"zero_quantized_weights": True},
        "qwz_hpz": {"zero_quantized_weights": True, "zero_hpz_partition_size": HPZ},
        "qgz": {"zero_quantized_gradients": True},
        "all_three": {"zero_quantized_weights": True, "zero_hpz_partition_size": HPZ, "zero_quantized_gradients": True}}
# Each column header: (the keys, which bytes); a header not here fails the test, so a new column gets a meaning.
COLUMNS = {
    "plain stage 3 inter-node": ("stage3", "inter"), "hpZ inter-node": ("hpz", "inter"),
    "plain intra": ("stage3", "intra"), "hpZ intra": ("hpz", "intra"),
    "plain stage 3": ("stage3", "inter"), "hpZ": ("hpz", "inter"), "qwZ": ("qwz", "inter"),
    "qwZ + hpZ": ("qwz_hpz", "inter"), "qwZ + hpZ intra": ("qwz_hpz", "intra"), "qgZ": ("qgz", "inter"),
    "all three (hpZ + qwZ + qgZ)": ("all_three", "inter"), "all three intra": ("all_three", "intra"),
}
RATIO = "ratio stage 3 / all three"


@functools.lru_cache(maxsize=None)
def explained(model: str, world_size: int, ranks_per_node: int, case: str, dtype: str = "float32") -> dict:
    """{"inter", "intra": wire bytes of the step, "parameters"} from `zero-lab explain --format json`
    on the docs' config: zero3.json with `stage3_prefetch_bucket_size: 0` and the case's keys."""
    import tempfile
    from pathlib import Path

    settings = json.loads((REPO / "harness" / "configs" / "zero3.json").read_text())
    settings["zero_optimization"]["stage3_prefetch_bucket_size"] = 0
    settings["zero_optimization"].update({key: ranks_per_node if value == HPZ else value
                                          for key, value in KEYS[case].items()})
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "config.json"
        path.write_text(json.dumps(settings))
        result = CliRunner().invoke(app, ["explain", "--model", model, "--stage", "3", "--gpus", str(world_size),
                                          "--ranks-per-node", str(ranks_per_node), "--dtype", dtype,
                                          "--config", str(path), "--format", "json"])
    assert result.exit_code == 0, result.output
    walk = json.loads(result.stdout)
    return {"inter": sum(item["wire_inter_bytes"] for item in walk["collectives"]),
            "intra": sum(item["wire_intra_bytes"] for item in walk["collectives"]), "parameters": walk["parameters"]}


def model_bytes(model: str, dtype: str = "float32") -> int:
    """M: the model's parameter bytes."""
    return explained(model, 2, 1, "stage3", dtype)["parameters"] * (4 if dtype == "float32" else 2)


def number(text: str) -> int:
    return int(text.replace(",", ""))


def rows() -> list:
    """(table, header, cells) of every row of the three tables, named by table, model and shape."""
    found = []
    for number, words in enumerate(TABLES, 1):
        header, *body = table_after(ZEROPP_MD, words)
        assert header[:2] == ["model", "W, K"], header
        found += [pytest.param(words, header, cells, id=f"table {number}, {cells[0]} W,K={cells[1].replace(' ', '')}")
                  for cells in body]
    return found


@pytest.mark.parametrize("table, header, cells", rows())
def test_every_cell_of_the_bytes_tables_is_explains_figure(table, header, cells):
    model = cells[0]
    world_size, ranks_per_node = (int(part) for part in cells[1].split(","))
    m = model_bytes(model)
    for name, cell in zip(header[2:], cells[2:]):
        if name == RATIO:
            plain, three = (explained(model, world_size, ranks_per_node, case)["inter"] for case in ("stage3", "all_three"))
            assert cell == f"{plain / three:.1f}x", (model, cells[1], name, cell)
            continue
        assert name in COLUMNS, f"{table}: column {name!r} has no meaning in this test (add it to COLUMNS)"
        case, side = COLUMNS[name]
        figure = explained(model, world_size, ranks_per_node, case)[side]
        stated = re.fullmatch(r"([\d,]+)(?: B)?(?: \(([\d.]+) M\))?", cell)
        assert stated, (model, cells[1], name, cell)
        assert number(stated[1]) == figure, (model, cells[1], name, cell, figure)
        if stated[2] is not None:
            assert stated[2] == f"{figure / m:.2f}", (model, cells[1], name, cell, figure / m)


def test_the_tables_cover_both_models_at_both_shapes():
    for words in TABLES:
        assert [(cells[0], cells[1]) for cells in table_after(ZEROPP_MD, words)[1:]] == [
            ("tiny", "4, 2"), ("tiny", "8, 4"), ("small", "4, 2"), ("small", "8, 4")], words


def test_the_model_sizes_and_hpz_alone_are_explains():
    for model in ("tiny", "small"):
        parameters = model_bytes(model) // 4
        assert f"{model}: {parameters:,} x 4 = {4 * parameters:,} B" in ZEROPP_TEXT, model
        for world_size, ranks_per_node in ((4, 2), (8, 4)):  # "hpZ alone measures 1.00 M + 4 B"
            assert explained(model, world_size, ranks_per_node, "hpz")["inter"] == model_bytes(model) + 4
    assert "hpZ alone measures 1.00 M + 4 B" in ZEROPP_TEXT


def test_the_bf16_figures_of_small_at_w8_k4_are_explains():
    m = model_bytes("small", "bfloat16")
    inter = {case: explained("small", 8, 4, case, "bfloat16")["inter"] for case in KEYS}
    qwz = (f"small at W=8 K=4 reads {inter['stage3'] / m:.2f} M, {inter['hpz'] / m:.2f} M (hpZ), "
           f"{inter['qwz'] / m:.2f} M (qwZ), {inter['qwz_hpz'] / m:.2f} M (qwZ + hpZ)")
    qgz = (f"small at W=8 K=4: plain {inter['stage3'] / m:.2f} M, qgZ {inter['qgz'] / m:.2f} M, all three "
           f"{inter['all_three']:,} B = {inter['all_three'] / m:.2f} M, {inter['stage3'] / inter['all_three']:.1f}x")
    assert qwz in ZEROPP_TEXT, qwz
    assert qgz in ZEROPP_TEXT, qgz
    assert f"in bf16 (the paper's precision) {inter['stage3'] / inter['all_three']:.1f}x at small W=8 K=4" in ZEROPP_TEXT
