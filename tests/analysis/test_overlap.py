"""When each collective of a traced step was issued (analysis/runs/speed/overlap.py) and `zero-lab
timeline`, on a timeline written here: the moments are told apart by the spans around each call."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from zero_lab.analysis.runs.speed.overlap import issued, moments
from zero_lab.cli.app import app

runner = CliRunner()


def span(name: str, category: str, start: float, end: float, **args) -> dict:
    return {"ph": "X", "name": name, "cat": category, "ts": start, "dur": end - start, "pid": 0, "tid": 1,
            "args": {"step": 3, **args}}


def collective(op: str, start: float, wire: int, step: int = 3) -> dict:
    return {**span(op, "collective", start, start + 5, wire_bytes=wire, payload_bytes=2 * wire), "args":
            {"step": step, "wire_bytes": wire, "payload_bytes": 2 * wire, "group_size": 2}}


TRACE = {"recordedSteps": [3], "traceEvents": [
    span("ProfilerStep#3", "step", 0, 100), span("forward", "phase", 0, 30), span("backward", "phase", 30, 80),
    span("autograd", "autograd", 31, 70), span("optimizer step", "phase", 80, 100),
    collective("all_gather_into_tensor", 2, 100),  # the forward's prefetch
    collective("reduce_scatter_tensor", 40, 10), collective("reduce_scatter_tensor", 69, 20),  # from hooks
    collective("all_reduce", 75, 30),  # the end of the backward, autograd done
    collective("all_gather_into_tensor", 90, 40),  # the step's publish
    collective("all_reduce", 110, 1, step=4)]}  # another step: not this one's


def test_each_call_falls_in_the_moment_around_it():
    calls = issued(TRACE, 3)
    assert [(call.op, call.moment, call.wire_bytes) for call in calls] == [
        ("all_gather", "forward", 100), ("reduce_scatter", "autograd", 10), ("reduce_scatter", "autograd", 20),
        ("all_reduce", "after autograd", 30), ("all_gather", "step", 40)]
    table = moments(calls)
    assert table["autograd"] == {"calls": 2, "wire_bytes": 30, "ops": ["reduce_scatter"]}
    assert list(table) == ["forward", "autograd", "after autograd", "step"]


def write_run(directory, trace) -> None:
    (directory / "trace").mkdir(parents=True)
    (directory / "trace" / "trace-rank0.json").write_text(json.dumps(trace))
    (directory / "summary.json").write_text(json.dumps({"impl": "nano", "stage": 2, "world_size": 2, "status": "ok"}))


def test_timeline_reads_the_last_traced_step_and_draws_it(tmp_path):
    write_run(tmp_path / "run", TRACE)
    result = runner.invoke(app, ["timeline", str(tmp_path / "run"), "--format", "json", "--plot", str(tmp_path / "t.png")])
    assert result.exit_code == 0, result.output
    (run,) = json.loads(result.stdout)["runs"]
    assert (run["run"], run["step"], run["moments"]["after autograd"]["wire_bytes"]) == ("nano s2 W=2", 3, 30)
    assert (tmp_path / "t.png").is_file()


def test_a_run_not_traced_or_a_step_not_traced_is_one_line_and_exit_2(tmp_path):
    write_run(tmp_path / "run", TRACE)
    (tmp_path / "plain").mkdir()
    (tmp_path / "plain" / "summary.json").write_text("{}")
    for argv in (["timeline", str(tmp_path / "plain")], ["timeline", str(tmp_path / "run"), "--step", "2"],
                 ["timeline", str(tmp_path / "run"), "--rank", "1"], ["timeline", str(tmp_path / "missing")]):
        result = runner.invoke(app, argv)
        assert result.exit_code == 2 and result.stderr.startswith("error: "), (argv, result.output)
        assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.output
