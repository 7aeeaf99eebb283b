"""What releases stage 3's gathered parameters, as docs/nano.md's table and the README's advice state
it: every figure recomputed by `zero-lab explain` for Qwen3-0.6B at 4 ranks in bf16."""

from __future__ import annotations

import json
import re

import pytest
from typer.testing import CliRunner

from zero_lab.cli.app import app
from tests.docs.doc_text import REPO, read, table_after

MIB = 2**20
STAGE3_KEYS = ("stage3_prefetch_bucket_size", "stage3_max_live_parameters", "stage3_max_reuse_distance",
               "stage3_param_persistence_threshold", "stage3_model_persistence_threshold", "overlap_comm")
# Each row's config, as its label says: the harness's zero3.json or DeepSpeed's defaults, then changes.
CONFIGS = {
    "zero3.json": ("zero3.json", {}),
    "zero3.json, prefetch 1": ("zero3.json", {"stage3_prefetch_bucket_size": 1}),
    "zero3.json, prefetch 0": ("zero3.json", {"stage3_prefetch_bucket_size": 0}),
    "zero3.json, max live 2e8": ("zero3.json", {"stage3_max_live_parameters": 200_000_000}),
    "defaults": ("defaults", {}),
    "defaults, prefetch 0": ("defaults", {"stage3_prefetch_bucket_size": 0}),
}
_explained: dict[str, dict] = {}


def explained(label: str, tmp_path_factory) -> dict:
    """explain's JSON for a row's config (each once per module)."""
    if label not in _explained:
        base, changes = CONFIGS[label]
        config = json.loads((REPO / "harness" / "configs" / "zero3.json").read_text())
        if base == "defaults":
            config["zero_optimization"] = {key: value for key, value in config["zero_optimization"].items()
                                           if key not in STAGE3_KEYS}
        config["zero_optimization"].update(changes)
        path = tmp_path_factory.mktemp("configs") / "config.json"
        path.write_text(json.dumps(config))
        result = CliRunner().invoke(app, ["explain", "--model", "qwen3-0.6b", "--stage", "3", "--gpus", "4",
                                          "--format", "json", "--config", str(path)])
        assert result.exit_code == 0, result.output
        _explained[label] = json.loads(result.stdout)
    return _explained[label]


def figures(walk: dict) -> dict[str, str]:
    forward = next(moment for moment in walk["moments"] if moment["name"] == "end_of_forward")
    gathers = [item for item in walk["collectives"] if item["op"] == "all_gather" and item["phase"] in ("forward", "backward")]
    return {"gathered": f"{forward['bytes']['gathered_parameters'] / MIB:.2f}", "holds": f"{forward['total_bytes'] / MIB:.2f}",
            "calls": str(len(gathers)), "wire": f"{sum(item['wire_bytes'] for item in gathers) / MIB:.2f}"}


NANO_MD = read(REPO / "docs" / "nano.md")
ROWS = table_after(NANO_MD, "What stays gathered at the end of the forward, and what releases it")


def test_the_table_has_every_config():
    assert [row[0] for row in ROWS[1:]] == list(CONFIGS)


@pytest.mark.parametrize("row", ROWS[1:], ids=[row[0] for row in ROWS[1:]])
def test_each_row_is_what_explain_computes(row, tmp_path_factory):
    label, *cells = row
    assert dict(zip(("gathered", "holds", "calls", "wire"), cells)) == figures(explained(label, tmp_path_factory))


def test_the_text_beside_the_table_and_the_readmes_advice_state_its_figures(tmp_path_factory):
    table = {row[0]: dict(zip(("gathered", "holds", "calls", "wire"), row[1:])) for row in ROWS[1:]}
    text = " ".join(NANO_MD.split("What stays gathered at the end of the forward")[1].split("Official queues")[0].split())
    whole, root, capped, kept = (table[label]["gathered"] for label in
                                 ("zero3.json", "zero3.json, prefetch 0", "zero3.json, max live 2e8", "defaults, prefetch 0"))
    assert f"every unit gathered ({whole} MB" in text and f"stays: {root} MB" in text and f"(2e8: {capped} MB)" in text
    ratio = float(table["zero3.json, prefetch 0"]["wire"]) / float(table["zero3.json"]["wire"])
    assert f"{ratio:.1f} times the wire bytes at prefetch 0" in text
    assert f"{kept} MB stay" in text
    six_layers = float(whole) - float(kept)  # the first 6 layers' units: every layer's the same size
    assert abs(six_layers / 6 * 28 - (float(whole) - float(root))) < 0.01, "the reuse distance frees 6 of the 28 layers"
    readme = " ".join(read(REPO / "README.md").split())
    assert (f"holds {whole} MB of gathered parameters per rank at the end of the forward" in readme
            and f"the tied embedding and head, {root} MB" in readme and f"(2e8: {capped} MB)" in readme)
    assert f"send {table['zero3.json, prefetch 0']['wire']} wire MB per step at prefetch 0 against {table['zero3.json']['wire']}" in readme
    for chinese in ([whole, root, capped, table["zero3.json, prefetch 0"]["wire"], table["zero3.json"]["wire"]]):
        assert chinese in read(REPO / "README.zh-CN.md")
