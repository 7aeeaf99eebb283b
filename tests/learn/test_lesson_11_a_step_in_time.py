"""Lesson 11, a step in time: its traced comparisons (tiny, step 3 traced: stages 0 and 2 with small
buckets, stage 3, then stage 2 with the harness's buckets) and `zero-lab timeline` on them run once,
as written; every number the lesson states is what they print, and its claims hold on the same
timelines (as data: `zero-lab timeline --format json`)."""

from __future__ import annotations

import json

import pytest

from tests.learn.course import (REPO, as_json, command_problems, excerpts_problems, lesson, mb, number_problems,
                                picture_problems, read, run_lesson, shown_commands)

pytestmark = [pytest.mark.slow, pytest.mark.official]  # launches torchrun: nano and official DeepSpeed, traced
TEXT = read(lesson(11))


@pytest.fixture(scope="module")
def ran(tmp_path_factory):
    return run_lesson(11, tmp_path_factory.mktemp("lesson-11"))


def shown(section: str, word: str) -> str:
    return next(item.command for item in shown_commands(TEXT) if item.section == section and word in item.command)


def timelines(ran, command: str) -> dict[str, dict]:
    """run label ("nano s2 W=2") -> its moments."""
    return {run["run"]: run["moments"] for run in as_json(command, ran.workdir)["runs"]}


def test_every_command_runs_as_written_in_under_a_minute_of_2_cores(ran):
    assert len(ran.outputs) == len(shown_commands(TEXT)) == 6 and not command_problems(ran)


def test_every_excerpt_is_what_the_command_prints(ran):
    assert not excerpts_problems(TEXT, ran)


def test_the_picture_is_what_its_command_draws(ran):
    assert not picture_problems(TEXT, ran)


def test_every_number_the_lesson_states_is_what_the_timelines_say(ran):
    runs = timelines(ran, shown("Run it", "timeline"))
    tried = timelines(ran, shown("Try it", "timeline"))
    wire = lambda moments, moment: moments[moment]["wire_bytes"]  # noqa: E731
    calls = lambda moments, moment: moments[moment]["calls"]  # noqa: E731
    nano_0, official_0, nano_2, official_2, nano_3, official_3 = (
        runs[f"{impl} s{stage} W=2"] for stage in (0, 2, 3) for impl in ("nano", "official"))
    # stage 0: every gradient byte after autograd, in both engines; nothing during it
    for moments in (nano_0, official_0):
        assert calls(moments, "forward") == calls(moments, "autograd") == 0
    assert wire(nano_0, "step") == wire(official_0, "after autograd")
    # stage 2: nano reduces every bucket during autograd; official all but its last
    assert calls(nano_2, "after autograd") == 0 and calls(official_2, "after autograd") == 1
    assert calls(nano_2, "autograd") > 1 and calls(official_2, "autograd") > 1
    # stage 3: the whole model gathered in the forward once, nothing gathered in the backward
    for moments in (nano_3, official_3):
        assert calls(moments, "forward") == 1 and moments["forward"]["ops"] == ["all_gather"]
        assert "all_gather" not in moments["autograd"]["ops"] + moments["after autograd"]["ops"]
    assert calls(nano_3, "after autograd") == 0 and calls(official_3, "autograd") == 0
    # Try it: the same bytes with one bucket, fewer calls; official's after autograd, nano's 2 during it
    assert wire(tried["nano s2 W=2"], "autograd") == wire(nano_2, "autograd")
    assert wire(tried["official s2 W=2"], "after autograd") == wire(official_2, "autograd") + wire(official_2, "after autograd")
    assert calls(tried["nano s2 W=2"], "autograd") == 2 and calls(tried["official s2 W=2"], "autograd") == 0
    small = json.loads((REPO / "docs/learn/configs/zero2-bucket-2e5.json").read_text())["zero_optimization"]
    harness = json.loads((REPO / "harness/configs/zero2.json").read_text())["zero_optimization"]
    assert small | {"reduce_bucket_size": harness["reduce_bucket_size"]} == harness, "one key apart"
    facts = {
        "stage 0": mb(wire(nano_0, "step")), "nano stage 2": mb(wire(nano_2, "autograd")),
        "official during autograd": mb(wire(official_2, "autograd")),
        "official after autograd": mb(wire(official_2, "after autograd")),
        "prefetch": mb(wire(nano_3, "forward")),
        "small buckets": f"{small['reduce_bucket_size']:,}", "harness buckets": f"{harness['reduce_bucket_size']:,}",
    }
    assert not number_problems(TEXT, facts)
