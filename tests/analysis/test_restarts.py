"""Reading a restarted run: torchrun's console split into attempts, the lost worker named, the repeated steps
superseded in the parsed log, each attempt's rank logs kept in order, and the doctor's words. The console below
is what torchrun 2.13 and the harness printed for a run whose rank 1 was killed (SIGKILL) after step 3."""

from __future__ import annotations

from pathlib import Path

from zero_lab.analysis.runs import rundir
from zero_lab.analysis.diagnosis.restarts import rank_restarted
from zero_lab.analysis.diagnosis.run_data import RunData
from zero_lab.analysis.runs.logparse import ParsedLog, parse_text
from zero_lab.analysis.runs.restart_history import restart_record

CONSOLE = """\
[default0]:[rank] global_rank=0 world_size=2 local_rank=0
[default0]:[opt_step 1] loss=5.51184368 step_ms=189.2 attempt=0
[default0]:[phase] step=1 phase=after_step live_bytes=10 peak_bytes=20
[default0]:[opt_step 2] loss=5.48822641 step_ms=112.9 attempt=0
[default0]:[ckpt] action=save step=2 tag=global_step2 bytes=13696880 files=3 seconds=0.038
[default0]:[opt_step 3] loss=5.51801229 step_ms=78.5 attempt=0
[default0]:[phase] step=3 phase=after_step live_bytes=30 peak_bytes=40
W1204 11:28:22.846000 6173 torch/distributed/elastic/multiprocessing/api.py:1028] Sending process 6185 closing signal SIGTERM
E1204 11:28:22.940000 6173 torch/distributed/elastic/multiprocessing/api.py:1002] failed (exitcode: -9) local_rank: 1 (pid: 6186) of binary: python
[default0]:[rank] global_rank=0 world_size=2 local_rank=0
[default0]:[ckpt] action=load step=2 tag=global_step2 bytes=13696880 files=3 seconds=0.036
[default0]:[opt_step 3] loss=5.51801229 step_ms=197.2 attempt=1
[default0]:[phase] step=3 phase=after_step live_bytes=31 peak_bytes=41
[default0]:[opt_step 4] loss=5.26758432 step_ms=76.1 attempt=1
"""


def test_the_restart_is_read_from_torchruns_line_and_the_harness_lines():
    parsed = parse_text(CONSOLE)
    assert restart_record(CONSOLE, parsed) == {
        "restarts": 1,
        "restart_events": [{"attempt": 1, "rank": 1, "exit_code": -9, "signal": "SIGKILL",
                            "logged_at": "1204 11:28:22.940000", "after_step": 3, "resumed_from_step": 2}],
        "repeated_steps": [3], "repeated_loss_max_diff": 0.0}


def test_a_step_logged_again_supersedes_its_first_row_and_phases():
    parsed = parse_text(CONSOLE)
    assert [(row["step"], row["attempt"]) for row in parsed.steps] == [(1, 0), (2, 0), (3, 1), (4, 1)]
    assert [(row["step"], row["attempt"]) for row in parsed.superseded] == [(3, 0)]
    assert [(row["step"], row["live_bytes"]) for row in parsed.phases] == [(1, 10), (3, 31)]


def test_a_run_without_restarts_records_none():
    text = "[default0]:[rank] global_rank=0 world_size=2 local_rank=0\n[default0]:[opt_step 1] loss=5.5 attempt=0\n"
    assert restart_record(text, parse_text(text)) == {"restarts": 0, "restart_events": [], "repeated_steps": [],
                                                      "repeated_loss_max_diff": None}


def test_each_ranks_attempts_are_kept_in_order(tmp_path):
    for attempt in (0, 1, 2, 10):
        for rank in (0, 1):
            directory = tmp_path / "torchrun" / "job" / f"attempt_{attempt}" / str(rank)
            directory.mkdir(parents=True)
            (directory / "stdout.log").write_text(f"rank {rank} attempt {attempt}\n")
    moved = rundir.collect_rank_logs(tmp_path / "torchrun", tmp_path / "logs")
    assert sorted(path.name for path in moved) == ["rank0.stdout.log", "rank1.stdout.log"]
    assert (tmp_path / "logs" / "rank1.stdout.log").read_text().splitlines() == [
        f"rank 1 attempt {attempt}" for attempt in (0, 1, 2, 10)]


def run_with(summary: dict) -> RunData:
    return RunData(Path("runs/r"), {"impl": "nano", "stage": 2, "world_size": 2, **summary}, ParsedLog(), {})


def test_the_doctor_tells_a_restart_and_warns_when_a_repeat_did_not_reproduce():
    summary = restart_record(CONSOLE, parse_text(CONSOLE))
    (found,) = rank_restarted(run_with(summary))
    assert found.code == "rank-restarted" and found.evidence[0] == (
        "attempt 1: rank 1 was killed by SIGKILL after step 3; every rank restarted from the checkpoint of step 2")
    changed = CONSOLE.replace("loss=5.51801229 step_ms=197.2", "loss=5.51801300 step_ms=197.2")
    codes = [finding.code for finding in rank_restarted(run_with(restart_record(changed, parse_text(changed))))]
    assert codes == ["rank-restarted", "restart-not-reproduced"]
    assert rank_restarted(run_with({"restart_events": []})) == []


def test_an_attempt_that_ended_by_an_exit_code_is_told_so():
    console = CONSOLE.replace("failed (exitcode: -9)", "failed (exitcode: 7)").replace(
        "[ckpt] action=load step=2 tag=global_step2 bytes=13696880 files=3 seconds=0.036\n", "")
    (event,) = restart_record(console, parse_text(console))["restart_events"]
    assert (event["exit_code"], event["signal"], event["resumed_from_step"]) == (7, None, 0)
    (found,) = rank_restarted(run_with(restart_record(console, parse_text(console))))
    assert found.evidence[0] == ("attempt 1: rank 1 exited with 7 after step 3; every rank restarted from step 1 "
                                 "(no checkpoint had been saved)")
