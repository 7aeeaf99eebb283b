"""Lesson 8, ZeRO against FSDP2: its three-way `zero-lab compare` (tiny, 6 steps, stage 3: three
launches) and its `estimate` and `config fsdp2` commands run once, as written; every number the
lesson states is what they print, and its claims hold on the same numbers."""

from __future__ import annotations

import json

import pytest

from tests.learn.course import (REPO, as_json, command_problems, excerpts_problems, lesson, number_problems,
                                picture_problems, read, run_lesson, shown_commands, table_rows)

pytestmark = [pytest.mark.slow, pytest.mark.official]  # launches torchrun: nano, official DeepSpeed, FSDP2
TEXT = read(lesson(8))


@pytest.fixture(scope="module")
def ran(tmp_path_factory):
    return run_lesson(8, tmp_path_factory.mktemp("lesson-8"))


def shown(section: str) -> list[str]:
    return [item.command for item in shown_commands(TEXT) if item.section == section]


def test_every_command_runs_as_written_in_under_a_minute_of_2_cores(ran):
    assert len(ran.outputs) == 4 and not command_problems(ran)


def test_every_excerpt_is_what_the_command_prints(ran):
    assert not excerpts_problems(TEXT, ran)


def test_the_picture_is_what_its_command_draws(ran):
    assert not picture_problems(TEXT, ran)


def test_every_number_the_lesson_states_is_what_the_commands_print(ran):
    rows = table_rows(ran.outputs[shown("Run it")[0]])
    nano, fsdp2, official = (0, 1, 2)  # the table's columns: candidates, then the baseline
    two = {row["stage"]: row for row in as_json(shown("The picture")[0], ran.workdir)["rows"]}
    four = {row["stage"]: row for row in as_json(shown("Try it")[0], ran.workdir)["rows"]}
    wire = [float(cell) for cell in rows["wire MB / step"][:3]]
    # FSDP2 gathers every block again in the backward: 3 (N-1)/N against nano's and official's 2 (N-1)/N
    assert wire[fsdp2] == pytest.approx(1.5 * wire[nano], abs=0.01) and wire[nano] == wire[official]
    # its "stage 2" shards the parameters as its stage 3 does; over twice the ranks, half the bytes
    assert two[2]["fsdp2_mb"] == two[3]["fsdp2_mb"] and four[2]["fsdp2_mb"] == pytest.approx(two[2]["fsdp2_mb"] / 2, rel=0.01)
    bucket = json.loads((REPO / "harness" / "configs" / "zero3.json").read_text())["zero_optimization"]["reduce_bucket_size"]
    facts = {
        "nano alloc": rows["alloc MB"][nano], "fsdp2 alloc": rows["alloc MB"][fsdp2],
        "official alloc": rows["alloc MB"][official], "fsdp2 wire": rows["wire MB / step"][fsdp2],
        "nano wire": rows["wire MB / step"][nano], "fsdp2 / nano": f"{wire[fsdp2] / wire[nano]:.1f}",
        "official's bucket": f"{bucket * 4 / 2**20:.2f}",
        "fsdp2 at stage 2": f"{two[2]['fsdp2_mb']:.1f}", "nano at stage 2": f"{two[2]['nano_mb']:.1f}",
        "nano at stage 3": f"{two[3]['nano_mb']:.1f}", "official at stage 2": f"{two[2]['official_estimator_mb']:.1f}",
        "official at stage 3": f"{two[3]['official_estimator_mb']:.1f}",
        "peak at stage 2": f"{two[2]['predicted_peak_mb']:.1f}", "peak at stage 3": f"{two[3]['predicted_peak_mb']:.1f}",
        "fsdp2 at 4": f"{four[2]['fsdp2_mb']:.1f}", "nano stage 2 at 4": f"{four[2]['nano_mb']:.1f}",
        "nano stage 3 at 4": f"{four[3]['nano_mb']:.1f}",
    }
    assert not number_problems(TEXT, facts, ("1.5",))
