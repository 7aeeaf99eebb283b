"""`zero-lab estimate --optimizer muon`: nano's model states with Muon's momentum (docs/muon.md)."""

import json

from typer.testing import CliRunner

from zero_lab.cli.app import app


def rows(*flags: str) -> list[dict]:
    result = CliRunner().invoke(app, ["estimate", "--model", "tiny", "--gpus", "2,3", "--stages", "1,2,3",
                                      "--dtype", "float32", "--format", "json", *flags])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)["rows"]


def test_muons_states_are_below_adams_by_its_smaller_optimizer_state():
    """Muon keeps 4 B of momentum where Adam keeps 8 B of states, for the hidden matrices (most of
    tiny's parameters), so nano's figure drops; the paper's column, Adam's, stays."""
    adam, muon = rows(), rows("--optimizer", "muon")
    for ours, theirs in zip(muon, adam):
        assert ours["optimizer"] == "muon" and ours["paper_mb"] == theirs["paper_mb"]
        assert ours["nano_mb"] < theirs["nano_mb"], (ours, theirs)


def test_a_parameter_count_has_no_matrices_for_muon():
    result = CliRunner().invoke(app, ["estimate", "--model", "600M", "--optimizer", "muon"])
    assert result.exit_code == 2 and "needs the model's matrices" in result.output
