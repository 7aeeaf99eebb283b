"""Lesson 10, when a run goes wrong: its commands (a module one rank skips at stage 3, a refusal and an
out-of-memory under an address-space limit, two runs whose weight decay differs, and the doctor on
each) run once, as written, each exiting as the lesson says; every number the lesson states is what
they print, and its claims hold on the same outputs."""

from __future__ import annotations

import json
import re
import shlex

import pytest

from tests.learn.course import (REPO, command_problems, excerpts_problems, lesson, number_problems, picture_problems,
                                read, run_lesson, shown_commands)

pytestmark = [pytest.mark.slow]  # launches torchrun: seven runs of nano, about 2 minutes on 2 cores
TEXT = read(lesson(10))
SCRIPT = REPO / "examples" / "skipping_script.py"


@pytest.fixture(scope="module")
def ran(tmp_path_factory):
    return run_lesson(10, tmp_path_factory.mktemp("lesson-10"))


def doctor_of(ran, name: str) -> str:
    """What `zero-lab doctor runs/<name>` printed (the lesson's own command)."""
    return ran.outputs[f"zero-lab doctor runs/{name}"]


def findings(ran, *names: str) -> list[dict]:
    from typer.testing import CliRunner

    from zero_lab.cli.app import app

    paths = [str(ran.workdir / "runs" / name) for name in names]
    return json.loads(CliRunner().invoke(app, ["doctor", *paths, "--format", "json"]).stdout)["findings"]


def figure(pattern: str, text: str) -> str:
    found = re.search(pattern, text)
    assert found, f"{pattern} not in:\n{text}"
    return found[1]


def line_of(text: str) -> int:
    return next(number for number, line in enumerate(SCRIPT.read_text().splitlines(), 1) if text in line)


def test_every_command_runs_and_exits_as_the_lesson_says_in_under_a_minute_of_2_cores(ran):
    assert len(ran.outputs) == len(shown_commands(TEXT)) == 12 and not command_problems(ran)


def test_every_excerpt_is_what_the_command_prints(ran):
    assert not excerpts_problems(TEXT, ran)


def test_the_picture_is_what_its_command_draws(ran):
    assert not picture_problems(TEXT, ran)


def test_each_failure_is_diagnosed_as_its_cause(ran):
    assert [finding["code"] for finding in findings(ran, "hang")] == ["collective-mismatch"]
    assert [finding["code"] for finding in findings(ran, "oom")] == ["out-of-memory"]
    assert [finding["code"] for finding in findings(ran, "decay", "no-decay")] == ["loss-divergence"]
    assert not findings(ran, "fits"), "the fix the refusal named runs clean"
    checked = [line for line in findings(ran, "checked")[0]["evidence"] if "torch's check" in line]
    assert checked, "torch's check is in the evidence"


def test_the_refusal_names_the_change_that_then_fits(ran):
    refused = next(output for command, output in ran.outputs.items() if "too-big" in command)
    change = figure(r"the cheapest change that fits: (--[\w-]+)", refused)
    fits = next(command for command in ran.outputs if "--name fits" in command)
    too_big = next(command for command in ran.outputs if "--name too-big" in command)
    assert set(shlex.split(fits)) - set(shlex.split(too_big)) == {change, "fits"}
    # "this batch's are large enough to be given back": the heap keeps none of this workload's freed tensors
    from zero_lab.analysis.memory.activation_memory import decoder_shape
    from zero_lab.analysis.memory.peak_memory import predict_peak

    argv = shlex.split(too_big)
    value = {flag: int(argv[argv.index(flag) + 1]) for flag in ("--batch-size", "--seq-len")}
    assert predict_peak(decoder_shape("tiny"), 0, "fp32", 2, value["--seq-len"], value["--batch-size"]).heap_kept == 0
    prose = (REPO / "docs/learn/10-when-a-run-goes-wrong.md").read_text().replace("\n", " ")
    assert "large enough to be given back" in prose


def test_every_number_the_lesson_states_is_what_the_commands_print(ran):
    hang = findings(ran, "hang")[0]["figures"]["ranks"]
    head, vision = hang["0"]["payload_bytes"] // 4, hang["1"]["payload_bytes"] // 4  # fp32 elements, whole modules
    oom = doctor_of(ran, "oom")
    stage_0, stage_1 = figure(r"live tensors: ([\d.]+) MB", oom), figure(r"--stage 1: predicted peak ([\d.]+)", oom)
    # at stage 0 with this batch the activations are the peak: stage 1 saves under 1%
    assert float(stage_0) - float(stage_1) < 0.01 * float(stage_0)
    decay = json.loads((REPO / "docs/learn/configs/zero2-constant-lr.json").read_text())["optimizer"]["params"]
    no_decay = json.loads((REPO / "docs/learn/configs/zero2-constant-lr-no-decay.json").read_text())["optimizer"]["params"]
    assert decay | {"weight_decay": no_decay["weight_decay"]} == no_decay, "one value apart"
    divergence = doctor_of(ran, "decay runs/no-decay")
    too_big = next(command for command in ran.outputs if "--name too-big" in command)
    facts = {
        "head": f"{head:,}", "vision": f"{vision:,}", "head's half": str(head // 2), "vision's half": str(vision // 2),
        "head's line": str(line_of("self.head(hidden)")), "vision's line": str(line_of("self.vision(hidden)")),
        "tokens": f"{int(shlex.split(too_big)[shlex.split(too_big).index('--seq-len') + 1]):,}",
        "stage 0": stage_0, "stage 1": stage_1,
        "decay": str(decay["weight_decay"]), "no decay": str(no_decay["weight_decay"]), "lr": str(decay["lr"]),
        "tolerance": figure(r"tolerance ([\d.]+)", divergence),
    }
    assert not number_problems(TEXT, facts)
