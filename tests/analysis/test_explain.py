"""`zero-lab explain`: the walk-through's bytes follow nano's layout and stage rules, its JSON is
the documented contract, bad input is one line, and a preset needs no torch."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from zero_lab.analysis.explain.explain import explain
from zero_lab.analysis.explain.explain_check import disagreements
from zero_lab.cli.app import app
from zero_lab.nano.config import load_config
from zero_lab.workload.model_shapes import preset_blocks, preset_parameters
from zero_lab.workload.meters.wire_bytes import wire_bytes

REPO = Path(__file__).resolve().parents[2]
runner = CliRunner()


def walk(stage, world_size=4, model="small", precision="bf16", micro_steps=1, data_types=None, **zero):
    config = json.loads((REPO / "harness" / "configs" / f"zero{stage}.json").read_text())
    config["bf16"] = {"enabled": precision == "bf16"}
    if data_types:
        config["data_types"] = data_types
    config["gradient_accumulation_steps"] = micro_steps
    config["zero_optimization"].update(zero)
    return explain(model, preset_parameters(model), preset_blocks(model), load_config(config, world_size=world_size),
                   world_size)


def total(walk_result, phase=None, op=None, key="payload_bytes"):
    return sum(item[key] for item in walk_result.to_json()["collectives"]
               if (phase is None or item["phase"] == phase) and (op is None or item["op"] == op))


@pytest.mark.parametrize("stage", [1, 2])
def test_stages_1_and_2_reduce_scatter_and_gather_every_padded_buffer_once(stage):
    """Buckets cover each padded buffer: 2(N-1)/N of it on the wire, where an all-reduce first costs 3."""
    result = walk(stage)
    padded_bytes = sum(buffer.layout.padded_numel * 2 for buffer in result.buffers)
    assert total(result, op="reduce_scatter") == total(result, op="all_gather") == padded_bytes
    assert total(result, op="reduce_scatter", key="wire_bytes") == pytest.approx(padded_bytes * 3 / 4, abs=64)
    all_reduce_first = walk(stage, reduce_scatter=False)
    assert total(all_reduce_first, op="all_reduce") == padded_bytes + 4  # the buckets, and the norm's 4 bytes
    ratio = total(result, key="wire_bytes") / total(all_reduce_first, key="wire_bytes")
    assert ratio == pytest.approx(2 / 3, rel=1e-3)


def test_stage_2_reduces_during_backward_and_stage_1_at_the_boundary():
    assert {item["phase"] for item in walk(1).to_json()["collectives"]} == {"reduce_gradients", "unscale_clip",
                                                                           "all_gather"}
    assert {item["phase"] for item in walk(2).to_json()["collectives"]} == {"backward", "unscale_clip", "all_gather"}
    accumulating = walk(2, micro_steps=3)
    assert total(accumulating, "backward") == 3 * total(walk(2), "backward"), "every micro-step reduces"


def test_stage_1_with_fp32_accumulation_all_reduces_full_fp32_gradients_at_the_boundary():
    """The fp32-accumulation variant (bf16, grad_accum_dtype fp32): its buckets are all-reduced,
    not reduce-scattered, and it holds full-size fp32 gradients (padded) where stage 1 holds bf16
    param.grad after backward and an fp32 gradient partition in the step."""
    plain, variant = walk(1), walk(1, data_types={"grad_accum_dtype": "fp32"})
    padded = sum(buffer.layout.padded_numel for buffer in variant.buffers)
    assert total(variant, op="reduce_scatter") == 0
    assert total(variant, "reduce_gradients", op="all_reduce") == total(plain, "reduce_gradients") == padded * 2
    memory = {moment["name"]: moment["bytes"] for moment in variant.to_json()["moments"]}
    for moment in ("end_of_backward", "optimizer_step"):
        assert (memory[moment]["gradients"], memory[moment]["gradient_partition"]) == (padded * 4, 0)
    assert memory["between_steps"]["gradients"] == 0


def test_stage_3_gathers_each_block_again_for_backward_unless_reuse_keeps_it():
    freed = walk(3, stage3_max_reuse_distance=0, stage3_prefetch_bucket_size=0)
    kept = walk(3, stage3_max_reuse_distance=10**9, stage3_prefetch_bucket_size=0)
    prefetched = walk(3, stage3_max_reuse_distance=0)  # official's rule: what the prefetch reached is kept
    blocks = [buffer for buffer in freed.buffers if buffer.sharded and buffer.unit != "root"]
    block_bytes = sum(buffer.layout.padded_numel * 2 for buffer in blocks)
    assert total(freed, "backward", "all_gather") == block_bytes
    assert total(kept, "backward", "all_gather") == 0
    assert total(prefetched, "backward", "all_gather") == 0  # small's 23M elements fit in one prefetch
    assert total(freed, "forward", "all_gather") == total(kept, "forward", "all_gather")
    end_of_forward = {moment["name"]: moment["bytes"] for moment in kept.to_json()["moments"]}["end_of_forward"]
    root_bytes = sum(buffer.layout.padded_numel * 2 for buffer in kept.buffers if buffer.unit == "root")
    assert end_of_forward["gathered_parameters"] == root_bytes + block_bytes
    assert all(item["wire_bytes"] == wire_bytes(item["op"], item["payload_bytes"], 4)
               for item in freed.to_json()["collectives"])


def test_one_rank_moves_nothing():
    assert walk(2, world_size=1).collectives == []


def test_a_measurement_that_differs_is_named_byte_for_byte():
    prediction = walk(2, world_size=2, model="tiny").to_json()
    by_call = {"forward": [], "backward": [], "step": []}
    for item in prediction["collectives"]:
        by_call["backward" if item["phase"] == "backward" else "step"].append(dict(item))
    memory = {moment["name"]: dict(moment["bytes"]) for moment in prediction["moments"]}
    assert disagreements(prediction, {"collectives": by_call, "memory": memory}) == []
    by_call["step"].pop()
    memory["end_of_backward"]["gradient_partition"] += 8
    problems = disagreements(prediction, {"collectives": by_call, "memory": memory})
    assert len(problems) == 2 and "step: predicted 1 more all_gather" in problems[0]
    assert "end_of_backward: gradient_partition" in problems[1]


def test_json_is_the_documented_contract():
    result = runner.invoke(app, ["explain", "--model", "tiny", "--stage", "3", "--gpus", "2", "--format", "json"])
    assert result.exit_code == 0, result.output
    payload = json.loads(result.stdout)
    assert payload["parameters"] == sum(entry.numel for entry in preset_parameters("tiny"))
    assert {"between_steps", "end_of_backward", "optimizer_step"} <= {moment["name"] for moment in payload["moments"]}
    for moment in payload["moments"]:
        assert moment["total_bytes"] == sum(moment["bytes"].values())
    assert payload["collectives"] and all({"phase", "op", "payload_bytes", "wire_bytes"} <= set(item)
                                          for item in payload["collectives"])


def test_markdown_is_one_document():
    result = runner.invoke(app, ["explain", "--model", "tiny", "--stage", "2", "--gpus", "2", "--format", "markdown"])
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("# One optimizer step of nano: tiny") and "| backward |" in result.stdout


@pytest.mark.parametrize("arguments, words", [
    (["--stage", "5"], "ZeRO stage 5 does not exist (--stage)"),
    (["--gpus", "0"], "--gpus must be 1 or more"),
    (["--format", "yaml"], "--format yaml"),
    (["--model", "no-such-model"], "--model 'no-such-model' is neither a preset"),
    (["--config", "missing.json"], "config missing.json does not exist"),
    (["--stage", "2", "--gathered"], "--gathered shows stage 3's fetch rules"),
    (["--stage", "3", "--gathered", "--measure"], "give --stage 3, without --measure and --plot"),
])
def test_bad_input_is_one_line_and_exit_2(arguments, words):
    result = runner.invoke(app, ["explain", *arguments])
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and words in lines[0], result.stderr


def test_a_config_with_leaf_module_is_refused(tmp_path):
    config = json.loads((REPO / "harness" / "configs" / "zero3.json").read_text())
    config["zero_optimization"]["leaf_module"] = {"classes": ["Qwen3MLP"]}
    path = tmp_path / "leaf.json"
    path.write_text(json.dumps(config))
    result = runner.invoke(app, ["explain", "--model", "tiny", "--stage", "3", "--config", str(path)])
    assert result.exit_code == 2 and "leaf_module, which explain does not model" in result.stderr


def test_explaining_a_preset_loads_no_torch():
    """Pure: the answer comes from arithmetic, so it comes at once."""
    script = ("import sys; from typer.testing import CliRunner; from zero_lab.cli.app import app; "
              "result = CliRunner().invoke(app, ['explain', '--model', 'qwen3-0.6b', '--stage', '3', '--gpus', '4']); "
              "assert result.exit_code == 0, result.output; "
              "print(sorted(m for m in ('torch', 'transformers', 'pandas', 'matplotlib') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]"


def test_the_peak_adds_zeropps_temporaries_to_the_phase_that_holds_the_most():
    """Without the quantized keys, and with no stage-3 call of several buffers (whose staging tensor
    is its temporary: a fetch's or prefetch's, or the persistent buffers' after the step), nothing
    holds a temporary and the peak is the fullest moment; with
    qwZ every int8 gather and with qgZ every bucket's first all-to-all carries its temporaries, and the
    peak is a phase's moment plus the largest of its own (docs/explain-json.md, `peak`)."""
    def walked(**zero):
        config = json.loads((REPO / "harness" / "configs" / "zero3.json").read_text())
        config["zero_optimization"].update(zero)
        return explain("tiny", preset_parameters("tiny"), preset_blocks("tiny"), load_config(config, world_size=4),
                       4, 2).to_json()

    # every call one unit's buffers, and no persistent parameter: no staging tensor
    plain = walked(stage3_prefetch_bucket_size=0, stage3_param_persistence_threshold=0)
    assert not any(item["temporary_bytes"] for item in plain["collectives"])
    assert plain["peak"]["bytes"] == max(moment["total_bytes"] for moment in plain["moments"])
    assert plain["peak"]["temporary_of"] is None
    staged = [item for item in walked()["collectives"] if item["temporary_bytes"]]
    assert all(item["op"] == "all_gather" and item["temporary_bytes"] == item["payload_bytes"] for item in staged)
    # zero3.json's one prefetch of several units, and the persistent buffers gathered after the step
    assert [item["what"].endswith("more units") for item in staged if item["phase"] == "forward"] == [True]
    assert [item["what"].endswith("persistent buffers") for item in staged if item["phase"] != "forward"] == [True]
    quantized = walked(zero_quantized_weights=True, zero_quantized_gradients=True)
    carriers = {item["what"].rsplit(" ", 1)[-1] if item["op"] == "all_gather" else item["what"].split(" int4, ")[1]
                for item in quantized["collectives"] if item["temporary_bytes"]}
    # every gather's values, every exchange's first (in-node) call, the persistent buffers' one call (not quantized)
    assert carriers == {"int8", "node", "buffers"}
    totals = {moment["name"]: moment["total_bytes"] for moment in quantized["moments"]}
    holds = {phase["name"]: phase["holds"] for phase in quantized["phases"]}
    expected = max(totals[holds[phase]] + max([item["temporary_bytes"] for item in quantized["collectives"]
                                               if item["phase"] == phase], default=0) for phase in holds)
    peak = quantized["peak"]
    assert peak["bytes"] == expected == totals[peak["moment"]] + peak["temporary_bytes"] > plain["peak"]["bytes"]
    assert peak["temporary_bytes"] == max(item["temporary_bytes"] for item in quantized["collectives"]
                                          if item["what"] == peak["temporary_of"])


def explained_json(*arguments: str) -> dict:
    result = runner.invoke(app, ["explain", *arguments, "--format", "json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_what_moves_groups_rows_that_repeat_per_layer_and_the_json_keeps_every_call():
    """qwen3-0.6b, stage 3, 4 ranks: the reduce-scatters of every layer print once per layer pattern;
    read in order, each row stands for the JSON's next calls (per layer x layers), and docs/cli.md
    states the counts."""
    from zero_lab.analysis.explain.explain_tables import collectives_table, mb

    collectives = explained_json("--model", "qwen3-0.6b", "--stage", "3", "--gpus", "4")["collectives"]
    _, body = collectives_table(collectives)
    rows, total = body[:-1], body[-1]
    assert [row[2] for row in rows if " x " in row[2]] == ["1 x 28 layers", "2 x 28 layers", "1 x 28 layers",
                                                           "3 x 28 layers"]
    position, index = 0, 0
    while index < len(rows):  # rows of one layer range together stand for those layers' calls, layer by layer
        span = re.search(r"\.(\d+)-(\d+)\.", rows[index][5])
        block = [rows[index]]
        while span and index + len(block) < len(rows) and span[0] in rows[index + len(block)][5]:
            block.append(rows[index + len(block)])
        layers = range(int(span[1]), int(span[2]) + 1) if span else [None]
        for layer in layers:
            for phase, op, calls, payload, wire, what in block:
                per_layer = int(calls.split(" x ")[0])
                calls_here = collectives[position:position + per_layer]
                first = what.split(" ... ")[0] if layer is None else what.split(" ... ")[0].replace(span[0], f".{layer}.")
                assert len(calls_here) == per_layer and calls_here[0]["what"] == first, (what, layer)
                assert all((item["phase"], item["op"], mb(item["payload_bytes"]), mb(item["wire_bytes"]))
                           == (phase, op, payload, wire) for item in calls_here), (what, layer)
                position += per_layer
        index += len(block)
    assert position == len(collectives) == int(total[2])
    stated = re.search(r"qwen3-0\.6b at stage 3 on 4\s+ranks prints its (\d+) calls in (\d+) rows",
                       (REPO / "docs" / "cli.md").read_text())
    assert (int(stated[1]), int(stated[2])) == (len(collectives), len(rows))


def test_layers_that_differ_are_not_grouped():
    from zero_lab.analysis.explain.explain_tables import collectives_table

    def call(layer: int, payload: int) -> dict:
        return {"phase": "backward", "op": "reduce_scatter", "payload_bytes": payload, "wire_bytes": payload // 2,
                "what": f"model.layers.{layer}.mlp.down_proj/decay bucket 1/1"}

    def layer(index: int, *payloads: int) -> list[dict]:
        return [call(index, payload) for payload in payloads]

    same = layer(0, 1000, 2000) + layer(1, 1000, 2000) + layer(2, 1000, 2000)
    assert [row[2] for row in collectives_table(same)[1][:-1]] == ["1 x 3 layers", "1 x 3 layers"]
    differ = layer(0, 1000, 2000) + layer(1, 1000, 3000) + layer(2, 1000, 2000)
    assert [row[2] for row in collectives_table(differ)[1][:-1]] == ["1"] * 6
    skipped = layer(0, 1000, 2000) + layer(2, 1000, 2000)  # not consecutive layers
    assert [row[2] for row in collectives_table(skipped)[1][:-1]] == ["1"] * 4


def test_gathered_follows_the_fetch_rules_layer_by_layer_and_agrees_with_the_walk():
    """`--gathered` on the small preset at 2 ranks (the harness's zero3.json): the forward's prefetch
    gathers every unit by the end of layer 0, and each layer's backward releases its own unit, so the
    figures after the backward climb by one layer's unit from the root's; once the forward is done the
    gathered bytes are the walk-through's at the end of the forward."""
    def gathered(*extra):
        result = runner.invoke(app, ["explain", "--model", "small", "--stage", "3", "--gpus", "2", "--gathered",
                                     "--format", "json", *extra])
        assert result.exit_code == 0, result.output
        return json.loads(result.stdout)

    layers = gathered()["layers"]
    three = walk(3, world_size=2)
    at_end_of_forward = three.moment_bytes("end_of_forward")["gathered_parameters"]
    assert layers and all(row["after_forward_bytes"] == at_end_of_forward for row in layers)
    steps = {later["after_backward_bytes"] - earlier["after_backward_bytes"] for earlier, later in zip(layers, layers[1:])}
    assert len(steps) == 1 and steps.pop() > 0
    table = runner.invoke(app, ["explain", "--model", "small", "--stage", "3", "--gpus", "2", "--gathered"])
    assert "stage3_max_reuse_distance 0" in table.stdout and "gathered after its backward" in table.stdout
