"""ZeRO++'s bytes through the harness at W=4 in nodes of 2 (tiny, CPU, gloo): the measured intra- and
inter-node wire bytes of a steady step equal `zero-lab explain`'s prediction exactly, for plain stage 3,
hpZ, qwZ, qgZ and all three (which covers qwZ with hpZ; qgZ's node size reaches nano from the harness's
--ranks-per-node); and official DeepSpeed 0.19.8, which trains with zero_hpz_partition_size on CPU, takes
the same losses and moves the same bytes per steady step.

The config keeps no block gathered from its forward to its backward (stage3_prefetch_bucket_size 0,
reuse distance 0), so backward gathers every block again: the gathers hpZ keeps inside the node.
Step 1 records stage 3's trace (official's fetch rules) and gathers more; steps 2 and 3 are steady.
Each impl's cases train once per module, one after another in one spawned world of 4 ranks
(tests/harness_world.py: the harness's own training, without a launch per case); their rank-0 logs
are reused.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.harness_world import Worlds
from zero_lab.cli.app import app
from zero_lab.workload.log_contract.log_lines import parse_line

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
WORLD_SIZE, RANKS_PER_NODE, STEPS = 4, 2, 3


# The ZeRO++ keys of each case: a name of its ideas ("stage3": none of them).
KEYS = {"stage3": {}, "hpz": {"zero_hpz_partition_size": RANKS_PER_NODE}, "qwz": {"zero_quantized_weights": True},
        "qgz": {"zero_quantized_gradients": True},
        "all_three": {"zero_quantized_weights": True, "zero_hpz_partition_size": RANKS_PER_NODE,
                      "zero_quantized_gradients": True}}
CASES_OF = {"nano": list(KEYS), "official": ["hpz"]}  # the cases each impl trains


def config(case: str) -> dict:
    settings = json.loads((REPO / "harness" / "configs" / "zero3.json").read_text())
    settings["zero_optimization"]["stage3_prefetch_bucket_size"] = 0
    settings["zero_optimization"].update(KEYS[case])
    return settings


@pytest.fixture(scope="module")
def config_path(tmp_path_factory):
    def write(case: str) -> Path:
        path = tmp_path_factory.mktemp("config") / f"{case}.json"
        path.write_text(json.dumps(config(case)))
        return path
    return write


@pytest.fixture(scope="module")
def run(config_path, tmp_path_factory):
    """run(impl, case) -> {step: [opt_step] fields} of that run's rank-0 log. The first call for an
    impl trains every case of that impl, one after another in one spawned world of 4 ranks."""
    worlds = Worlds(WORLD_SIZE, {impl: {f"{impl}-{case}": ["--impl", impl, "--deepspeed_config", str(config_path(case)),
                                                           "--model-name", "tiny", "--steps", str(STEPS),
                                                           "--batch-size", "2", "--seq-len", "32", "--seed", "0",
                                                           "--device", "cpu", "--ranks-per-node", str(RANKS_PER_NODE)]
                                        for case in cases} for impl, cases in CASES_OF.items()},
                    tmp_path_factory.mktemp)

    def steps(impl: str, case: str) -> dict:
        lines = [parse_line(line) for line in worlds.output(f"{impl}-{case}").splitlines()]
        return {step: fields for tag, step, fields in filter(None, lines) if tag == "opt_step"}

    return steps


def predicted(config_file: Path) -> tuple[int, int]:
    """`zero-lab explain`'s intra- and inter-node wire bytes of one steady step of one rank."""
    result = CliRunner().invoke(app, ["explain", "--model", "tiny", "--stage", "3", "--gpus", str(WORLD_SIZE),
                                      "--ranks-per-node", str(RANKS_PER_NODE), "--dtype", "float32",
                                      "--config", str(config_file), "--format", "json"])
    assert result.exit_code == 0, result.output
    moved = json.loads(result.stdout)["collectives"]
    return sum(item["wire_intra_bytes"] for item in moved), sum(item["wire_inter_bytes"] for item in moved)


@pytest.mark.parametrize("case", list(KEYS))
def test_a_steady_steps_intra_and_inter_node_bytes_are_explains_prediction(run, config_path, case):
    intra, inter = predicted(config_path(case))
    for step in (2, 3):
        fields = run("nano", case)[step]
        assert (fields["comm_wire_intra_bytes"], fields["comm_wire_inter_bytes"]) == (intra, inter), step


def test_hpz_keeps_backwards_gathers_inside_the_node(run):
    """The inter-node bytes fall by exactly the blocks' backward all-gathers; the intra-node bytes
    grow by the same gathers over a group of 2 (half the payload on the wire instead of 3/4)."""
    plain, hpz = run("nano", "stage3")[3], run("nano", "hpz")[3]
    assert hpz["comm_wire_inter_bytes"] < plain["comm_wire_inter_bytes"]
    assert hpz["comm_wire_bytes"] < plain["comm_wire_bytes"]
    saved = plain["comm_wire_inter_bytes"] - hpz["comm_wire_inter_bytes"]  # (N-K)/N = 1/2 of the payload P
    grown = hpz["comm_wire_intra_bytes"] - plain["comm_wire_intra_bytes"]  # (K-1)/K - (K-1)/N = 1/4 of P
    assert 2 * grown == saved


def test_qwz_sends_a_quarter_of_the_fp32_gathers_plus_the_scales(run, config_path):
    """Every gather's payload falls from 4 bytes to 1 per element, plus one 4-byte scale per block of
    thousands of elements; the reduce-scatters and the norm's all-reduce do not change. So a steady
    step moves 3/4 of plain stage 3's gathered bytes less, give back the scales (under 1% of them)."""
    result = CliRunner().invoke(app, ["explain", "--model", "tiny", "--stage", "3", "--gpus", str(WORLD_SIZE),
                                      "--config", str(config_path("stage3")), "--dtype", "float32", "--format", "json"])
    gathered = sum(item["payload_bytes"] for item in json.loads(result.stdout)["collectives"]
                   if item["op"] == "all_gather" and item["phase"] in ("forward", "backward"))
    plain, qwz = run("nano", "stage3")[3], run("nano", "qwz")[3]
    saved = plain["comm_bytes"] - qwz["comm_bytes"]
    scales = 3 * gathered // 4 - saved
    assert 0 < scales < gathered // 100, (gathered, saved)


@pytest.mark.official
def test_official_trains_with_hpz_to_the_same_losses_and_inter_node_bytes(run):
    """Official DeepSpeed's steady step sends the same bytes across nodes as nano's, but for its
    scalar all-reduces (it all-reduces two 4-byte flags where nano all-reduces one norm), and fewer
    than plain stage 3 does. (Within the node it sends more: under this config it also gathers the
    root unit again in backward, where nano holds it from the forward; that gather is stage 3's,
    with or without hpZ, and hpZ keeps it inside the node.)"""
    nano, official, plain = run("nano", "hpz"), run("official", "hpz"), run("nano", "stage3")
    for step in range(1, STEPS + 1):
        assert abs(nano[step]["loss"] - official[step]["loss"]) <= 1e-5, (step, nano[step]["loss"], official[step]["loss"])
    inter = {name: log[STEPS]["comm_wire_inter_bytes"] for name, log in (("nano", nano), ("official", official))}
    assert 0 <= inter["official"] - inter["nano"] <= 64, inter
    assert inter["official"] < plain[STEPS]["comm_wire_inter_bytes"]


def test_qgz_sends_fewer_bytes_and_fewer_across_nodes(run):
    """qgZ's int4 all-to-alls replace the fp32 reduce-scatter: fewer bytes in all, and fewer cross nodes."""
    plain, qgz = run("nano", "stage3")[3], run("nano", "qgz")[3]
    assert qgz["comm_wire_inter_bytes"] < plain["comm_wire_inter_bytes"]
    assert qgz["comm_bytes"] < plain["comm_bytes"]
