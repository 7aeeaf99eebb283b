"""Simulated nodes: the intra-/inter-node split of the wire bytes (a pure function, by hand), and
--ranks-per-node refused in one line, exit 2, where it does not divide the world size."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from zero_lab.cli.app import app
from zero_lab.workload.nodes import ranks_per_node_problem, resolve_ranks_per_node
from zero_lab.workload.meters.wire_bytes import ranks_on_node, wire_bytes, wire_split

S = 4800  # bytes of the whole array


@pytest.mark.parametrize("operation, group_size, on_my_node, intra, inter", [
    # W=4 in nodes of 2: a share of S/4 to the neighbour on the node, two shares to the other node
    ("all_gather_into_tensor", 4, 2, S // 4, S // 2),
    ("reduce_scatter", 4, 2, S // 4, S // 2),
    ("all_to_all_single", 4, 2, S // 4, S // 2),
    ("all_reduce", 4, 2, 2 * S // 4, 2 * S // 2),  # a reduce-scatter, then an all-gather
    ("broadcast", 4, 2, S // 3, 2 * S // 3),  # S split as 1 peer on the node : 2 off it
    # W=8 in nodes of 4: 3 shares stay, 4 leave
    ("all_gather", 8, 4, 3 * S // 8, 4 * S // 8),
    # a group inside one node (hpZ's secondary gather): nothing crosses
    ("all_gather_single", 2, 2, S // 2, 0),
    # every rank on its own node: everything crosses
    ("all_gather", 4, 1, 0, 3 * S // 4),
    ("all_reduce", 1, 1, 0, 0),
])
def test_a_ranks_wire_bytes_split_into_its_own_node_and_the_others(operation, group_size, on_my_node, intra, inter):
    assert wire_split(operation, S, group_size, on_my_node) == (intra, inter)
    assert intra + inter == wire_bytes(operation, S, group_size)


def test_nodes_are_consecutive_ranks():
    assert ranks_on_node([0, 1, 2, 3], rank=1, ranks_per_node=2) == 2
    assert ranks_on_node([0, 2], rank=2, ranks_per_node=2) == 1  # the group of equal positions across nodes
    assert ranks_on_node(list(range(8)), rank=5, ranks_per_node=4) == 4


def test_ranks_per_node_must_divide_the_world_and_defaults_to_the_launchers():
    assert ranks_per_node_problem(None, 4) is None and ranks_per_node_problem(2, 4) is None
    assert "does not divide the world size 4" in ranks_per_node_problem(3, 4)
    assert "is not a number of ranks" in ranks_per_node_problem(0, 4)
    assert resolve_ranks_per_node(2, 4, 4) == 2
    assert resolve_ranks_per_node(None, 4, 8) == 4  # torchrun's LOCAL_WORLD_SIZE
    assert resolve_ranks_per_node(None, None, 4) == 4  # no launcher: one node


@pytest.mark.parametrize("command", [["run", "--impl", "nano", "--gpus", "4"], ["compare", "--gpus", "4"]])
def test_run_and_compare_refuse_a_ranks_per_node_that_does_not_divide_the_world(command, tmp_path):
    result = CliRunner().invoke(app, [*command, "--device", "cpu", "--model", "tiny", "--ranks-per-node", "3",
                                      "--out", str(tmp_path)])
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "--ranks-per-node 3 does not divide the world size 4" in lines[0], result.stderr
    assert not list(tmp_path.iterdir())  # refused before any run directory


def test_the_harness_refuses_it_in_one_line(monkeypatch, capsys):
    from zero_lab.harness import train

    for key, value in dict(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1").items():
        monkeypatch.setenv(key, value)
    assert train.main(["--ranks-per-node", "2"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "error: --ranks-per-node 2 does not divide the world size 1" in err, err
