"""Lesson 9, checkpoints: its `zero-lab run` (tiny, 3 steps, saving: one launch) and its
`checkpoint` commands (offline, in this process) run once, as written; the picture, the excerpts and
every number the lesson states are what they print, and each file holds what the lesson says."""

from __future__ import annotations

import pytest

from tests.learn.course import (command_problems, excerpts_problems, lesson, number_problems, picture_problems, read,
                                run_lesson)

pytestmark = pytest.mark.slow  # launches torchrun
TEXT = read(lesson(9))


@pytest.fixture(scope="module")
def ran(tmp_path_factory):
    return run_lesson(9, tmp_path_factory.mktemp("lesson-9"))


def test_every_command_runs_as_written_in_under_a_minute_of_2_cores(ran):
    assert len(ran.outputs) == 5 and not command_problems(ran)


def test_every_excerpt_is_what_the_command_prints(ran):
    assert not excerpts_problems(TEXT, ran)


def test_the_picture_is_what_its_command_draws(ran):
    assert not picture_problems(TEXT, ran)


def tensors(ran, directory: str) -> tuple[int, list[dict]]:
    """(parameters, per file its tensor bytes by role), as the picture counts them."""
    from zero_lab.analysis.report.checkpoint_plot import picture_numbers
    from zero_lab.nano.checkpoint.offline import OpenCheckpoint

    checkpoint = OpenCheckpoint.open(str(ran.workdir / directory))
    numbers = picture_numbers(checkpoint)
    return sum(shape.numel() for shape in checkpoint.shapes().values()), numbers["files"]


def test_every_number_the_lesson_states_is_what_the_files_hold(ran):
    from zero_lab.nano.checkpoint.offline import OpenCheckpoint, describe

    parameters, files = tensors(ran, "runs/learn-ckpt")
    _, cut_for_4 = tensors(ran, "runs/learn-ckpt-w4")
    model_states, *optimizer = files
    # the model states file: the whole fp32 model; each optimizer file: master and two moments of 1/N
    assert model_states["bytes"]["parameters (module)"] == 4 * parameters
    moments = ("fp32 master partition", "Adam exp_avg", "Adam exp_avg_sq")
    for size, cut in ((2, optimizer), (4, cut_for_4[1:])):
        assert len(cut) == size
        assert all(sum(entry["bytes"][role] for role in moments) == 12 * parameters // size for entry in cut)
    bytes_for_4 = describe(OpenCheckpoint.open(str(ran.workdir / "runs/learn-ckpt-w4")))["file_bytes"]
    facts = {
        "P": f"{parameters:,}", "module bytes": f"{4 * parameters:,}", "half": f"{parameters // 2:,}",
        "a rank's tensors": f"{sum(optimizer[0]['bytes'][role] for role in moments):,}",
        "a rank's tensors at 4": f"{sum(cut_for_4[1]['bytes'][role] for role in moments):,}",
        "a file at 4": f"{bytes_for_4['zero_pp_rank_0_mp_rank_00_optim_states.pt']:,}",
    }
    assert not number_problems(TEXT, facts)
