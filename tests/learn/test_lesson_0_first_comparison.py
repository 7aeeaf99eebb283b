"""Lesson 0, your first comparison: its `zero-lab compare` (tiny, 6 steps, both impls: two launches)
and its `explain` commands run once, as written; `make demo`'s excerpt is held to the report it
writes (reports/cpu-demo.md); every number the lesson states is what they print."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.docs.test_stated_figures import DEMO, demo_cell
from tests.learn.course import (as_json, command_problems, excerpt_problems, excerpts_problems, lesson, mb, moment,
                                number_problems, picture_problems, read, run_lesson, shown_commands, table_rows, wire)

pytestmark = [pytest.mark.slow, pytest.mark.official]  # launches torchrun, nano and official DeepSpeed
TEXT = read(lesson(0))
HARNESS_ZERO2 = Path(__file__).resolve().parents[2] / "zero_lab" / "harness" / "configs" / "zero2.json"


@pytest.fixture(scope="module")
def ran(tmp_path_factory):
    return run_lesson(0, tmp_path_factory.mktemp("lesson-0"))


def shown(section: str, program: str = "zero-lab"):
    return [item for item in shown_commands(TEXT) if item.section == section and item.command.startswith(program)]


def test_every_command_runs_as_written_in_under_a_minute_of_2_cores(ran):
    assert len(ran.outputs) == 3 and not command_problems(ran)


def test_every_excerpt_is_what_the_command_prints(ran):
    assert not excerpts_problems(TEXT, ran)


def test_make_demos_excerpt_is_what_make_demo_wrote():
    (demo,) = shown("Run it", "make")
    assert demo.command == "make demo" and not excerpt_problems(demo.excerpt, DEMO)


def test_the_picture_is_what_its_command_draws(ran):
    assert not picture_problems(TEXT, ran)


def test_every_number_the_lesson_states_is_what_the_commands_print(ran):
    compare = ran.outputs[shown("Run it")[0].command]
    rows = table_rows(compare)
    drawn, tried = as_json(shown("The picture")[0].command, ran.workdir), as_json(shown("Try it")[0].command, ran.workdir)
    nano_wire, official_wire = float(rows["wire MB / step"][0]), float(rows["wire MB / step"][1])
    # alloc is the model states explain predicts; the wire bytes are explain's; official sends 1.5 times nano's
    assert rows["alloc MB"][0] == mb(moment(drawn, "between_steps")["total_bytes"], 1)
    assert rows["wire MB / step"][0] == mb(wire(drawn))
    assert official_wire == pytest.approx(1.5 * nano_wire, abs=0.01)
    assert mb(wire(tried)) == mb(wire(drawn)) and demo_cell(3)["wire MB / step"][3] == "ratio 1.000"
    # the losses of 6 steps show updates 1-5, of which WarmupLR's first two run at learning rate 0
    steps = int(re.search(r"--steps (\d+)", shown("Run it")[0].command)[1])
    updates = int(re.search(r"loss parity: yes over (\d+) updates", compare)[1])
    assert updates == steps - 3 == 3 and rows["loss parity"][2] == f"yes ({updates} updates)"
    # official's peak is nano's plus its whole gradient bucket; its alloc adds an fp32 copy of the partition
    bucket = json.loads(HARNESS_ZERO2.read_text())["zero_optimization"]["reduce_bucket_size"] * 4
    nano_peak, official_peak = float(rows["peak alloc MB"][0]), float(rows["peak alloc MB"][1])
    assert abs(official_peak - nano_peak - bucket / 2**20) < 2, "the bucket is most of the difference"
    partition_copy = drawn["parameters"] * 4 / 2
    assert float(rows["alloc MB"][1]) - float(rows["alloc MB"][0]) == pytest.approx(partition_copy / 2**20, abs=0.1)
    nano_bucket = next(item["payload_bytes"] for item in drawn["collectives"] if item["op"] == "reduce_scatter")
    assert "doctor: 1 finding (buckets-dominate)" in compare
    facts = {
        "official peak": rows["peak alloc MB"][1], "official alloc": rows["alloc MB"][1], "bucket": mb(bucket),
        "partition copy": mb(partition_copy), "nano bucket": mb(nano_bucket),
        "tolerance": re.search(r"tolerance ([\d.]+)\)", compare)[1], "P": f"{drawn['parameters']:,}",
        "nano alloc": rows["alloc MB"][0], "nano peak": rows["peak alloc MB"][0],
        "nano wire": rows["wire MB / step"][0],
        "official wire": rows["wire MB / step"][1], "ratio": rows["wire MB / step"][3].split()[1],
        "payload": rows["comm MB / step"][0],
        "between steps": mb(moment(drawn, "between_steps")["total_bytes"]),
        "end of backward": mb(moment(drawn, "end_of_backward")["total_bytes"]),
        "stage 3 between steps": mb(moment(tried, "between_steps")["total_bytes"]),
        "stage 3 parameters": mb(moment(tried, "between_steps")["bytes"]["parameters"]),
        "stage 2 parameters": mb(moment(drawn, "between_steps")["bytes"]["parameters"]),
        "demo stage 3 ratio": demo_cell(3)["wire MB / step"][3].split()[1],
    }
    assert not number_problems(TEXT, facts)
