"""The harness's side of a restart, without a launch: which attempt resumes from `latest`, and the
fault-injection moments a test names (`ZERO_LAB_RANK_PAUSE_AT`)."""

from __future__ import annotations

import pytest

from zero_lab.workload.faults import rank_pause
from zero_lab.workload.faults import restart_hooks as restarts


def test_only_a_restarted_attempt_resumes_from_latest_and_only_when_one_was_saved(tmp_path):
    assert restarts.resume_tag(str(tmp_path), None, attempt=1) is None  # nothing saved yet: from step 1
    (tmp_path / "latest").write_text("global_step2")
    assert restarts.resume_tag(str(tmp_path), None, attempt=0) is None
    assert restarts.resume_tag(str(tmp_path), "global_step2", attempt=0) == "global_step2"
    assert restarts.resume_tag(str(tmp_path), None, attempt=1) == "latest"
    assert restarts.resume_tag(str(tmp_path), "global_step0", attempt=2) == "latest"
    assert restarts.resume_tag(None, None, attempt=1) is None


def test_latest_moves_only_after_the_barrier_and_only_on_rank_0(tmp_path):
    calls = []
    restarts.commit_latest(str(tmp_path), "global_step4", 1, lambda: calls.append("barrier"))
    assert calls == ["barrier"] and not (tmp_path / "latest").exists()
    restarts.commit_latest(str(tmp_path), "global_step4", 0, lambda: calls.append(sorted(p.name for p in tmp_path.iterdir())))
    assert calls[-1] == [] and (tmp_path / "latest").read_text() == "global_step4"


def test_each_attempt_reads_its_own_pause():
    value = "1:save-4,0:step-5"
    assert rank_pause.requested(value, 0) == (1, "save-4")
    assert rank_pause.requested(value, 1) == (0, "step-5")
    assert rank_pause.requested(value, 2) is None
    assert rank_pause.requested(None, 0) is None


@pytest.mark.parametrize("value", ["1:step", "x:step-3", "1:forward-3", "1-step-3", "1:save-4,0:step"])
def test_a_malformed_pause_is_refused(value):
    with pytest.raises(ValueError, match="ZERO_LAB_RANK_PAUSE_AT"):
        rank_pause.requested(value, 0)


def test_without_the_variable_no_moment_pauses(monkeypatch):
    monkeypatch.delenv(rank_pause.PAUSE_VARIABLE, raising=False)
    rank_pause.reached(0, "step", 1)  # returns at once
    monkeypatch.setenv(rank_pause.PAUSE_VARIABLE, "1:step-1")
    rank_pause.reached(0, "step", 1)  # another rank's moment
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    rank_pause.reached(1, "step", 1)  # the first attempt's moment, in the second


def test_a_star_pauses_whichever_rank_has_the_variable():
    assert rank_pause.requested("*:step-3", 0) == ("*", "step-3")
