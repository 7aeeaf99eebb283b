"""The pictures `--plot` draws (`analysis.report.picture`, `explain_plot`, `estimate_plot`): each carries the
numbers it draws, the same numbers draw the same bytes, "who holds what" follows the stage table, and a
bad `--plot` path is one line and exit 2 before any work."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from zero_lab.analysis.explain.explain import explain
from zero_lab.analysis.explain.explain_plot import picture_numbers, plot_walkthrough
from zero_lab.analysis.report.picture import picture_data, picture_pixels
from zero_lab.cli.app import app
from zero_lab.cli.explain_cmd import explained_config, model_table
from zero_lab.nano import stages

runner = CliRunner()


def walk(stage: int, world_size: int = 4, offload: str = "none", model: str = "tiny"):
    _, typed, _ = explained_config(None, stage, "bfloat16", offload, world_size)
    return explain(model, *model_table(model), typed, world_size)


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_who_holds_what_is_a_share_of_1_or_1_over_n_as_the_stage_table_partitions(stage):
    row, lanes = stages.of(stage), picture_numbers(walk(stage, model="qwen3-0.6b"))["shares"]
    partitioned = {"parameters": row.partitions_parameters, "gradients": row.reduces_during_backward,
                   "fp32 master": row.partitions_optimizer_states, "Adam states": row.partitions_optimizer_states}
    for lane, split in partitioned.items():
        # stage 3 keeps the small (persistent) parameters whole: the norms, a hair over a quarter
        assert lanes[lane]["fraction"] == (pytest.approx(1 / 4, abs=1e-3) if split else 1.0), (stage, lane, lanes[lane])
    assert lanes["parameters"]["gathered"] == (stage == 3)


def test_offloaded_lanes_are_on_the_host():
    lanes = picture_numbers(walk(3, offload="param"))["shares"]
    assert all(lane["host"] for lane in lanes.values())
    assert not any(lane["host"] for lane in picture_numbers(walk(3))["shares"].values())


def test_the_numbers_drawn_are_the_walk_throughs_and_draw_the_same_bytes_twice(tmp_path):
    step = walk(2, world_size=2)
    first, second = plot_walkthrough(step, tmp_path / "a.png"), plot_walkthrough(step, tmp_path / "b.png")
    assert first.read_bytes() == second.read_bytes()
    carried = picture_data(first)["data"]
    payload = step.to_json()
    assert carried["holds"]["end_of_backward"]["gradient_partition"][0] == next(
        item["bytes"]["gradient_partition"] for item in payload["moments"] if item["name"] == "end_of_backward")
    assert sum(sum(parts) for moved in carried["moves"].values() for parts in moved.values()) == sum(
        item["wire_bytes"] for item in payload["collectives"])
    assert carried["data_parallel_wire_bytes"] == 2 * (2 - 1) * 2 * payload["parameters"] // 2


def test_other_numbers_draw_another_picture(tmp_path):
    two, four = plot_walkthrough(walk(2, 2), tmp_path / "2.png"), plot_walkthrough(walk(2, 4), tmp_path / "4.png")
    assert picture_data(two)["data"] != picture_data(four)["data"]
    assert picture_pixels(two).shape != picture_pixels(four).shape or (picture_pixels(two) != picture_pixels(four)).any()


@pytest.mark.parametrize("argv", [["explain", "--model", "tiny"], ["estimate", "--model", "tiny", "--gpus", "2"]])
@pytest.mark.parametrize("plot, problem", [("step.jpg", "is not a .png file"), ("no/such/dir/step.png", "does not exist")])
def test_a_bad_plot_path_is_one_line_and_exit_2(argv, plot, problem, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(app, [*argv, "--plot", plot])
    assert result.exit_code == 2 and problem in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert not list(tmp_path.iterdir())


def test_estimate_draws_the_rows_it_prints(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(app, ["estimate", "--model", "tiny", "--gpus", "2", "--stages", "2,3", "--impls",
                                 "nano,fsdp2", "--plot", "peaks.png", "--device-memory", "24"])
    assert result.exit_code == 0, result.output
    rows = picture_data(tmp_path / "peaks.png")["data"]["rows"]
    assert [(row["world_size"], row["stage"]) for row in rows] == [(2, 2), (2, 3)]
    for row in rows:
        printed = next(line for line in result.stdout.splitlines() if line.startswith(f"│ 2 ") and f"│     {row['stage']} │" in line)
        assert f"{row['nano_mb']:.1f}" in printed and f"{row['fsdp2_mb']:.1f}" in printed


def test_a_collective_has_one_colour_in_every_picture():
    """explain's wire bytes and a trace's timeline colour each collective from one table."""
    from zero_lab.analysis.explain import explain_plot
    from zero_lab.analysis.report import picture, timeline_plot

    assert explain_plot.OP_COLOURS is picture.OP_COLOURS and timeline_plot.OP_COLOURS is picture.OP_COLOURS
    assert set(explain_plot.EXPLAINED_OPS) <= set(picture.OP_COLOURS)
    assert len(set(picture.OP_COLOURS.values())) == len(picture.OP_COLOURS)  # no two collectives alike
    assert not set(picture.OP_COLOURS.values()) & set(timeline_plot.PHASE_COLOURS.values())  # nor a phase
