"""The timeline recorder in one process (no launch): which steps it records, its memory counter against the
exact meter's own peak, nano's moments as nested spans, and the snapshot torch's memory viewer reads;
`--trace-steps` parsing and the CLI's one-line errors; the communication summary's bandwidths against
DeepSpeed's own comms-logger arithmetic."""

import json
import pickle

import pytest
import torch
from typer.testing import CliRunner

from zero_lab.analysis.runs import traces
from zero_lab.cli.app import app
from zero_lab.nano.collectives import labelled
from zero_lab.workload.meters.comm_meter import CommMeter
from zero_lab.workload.meters.memory_meter import MemoryMeter
from zero_lab.workload.step_phase import Phase, StepPhase
from zero_lab.workload.tracing.timeline import start_tracing
from zero_lab.workload.tracing.trace_settings import (TRACE_DIRECTORY_ENVIRONMENT, TRACE_STEPS_ENVIRONMENT, TraceRequest,
                                              parse_steps, trace_environment)


@pytest.mark.parametrize("text, steps", [("1-3", {1, 2, 3}), ("2", {2}), ("1,4", {1, 4}), ("2-3, 6", {2, 3, 6})])
def test_trace_steps_parse(text, steps):
    assert parse_steps(text) == steps


@pytest.mark.parametrize("text", ["", "0", "3-2", "a", "1-", "-2", "1;2"])
def test_trace_steps_that_name_no_step_are_refused(text):
    with pytest.raises(ValueError, match="--trace-steps"):
        parse_steps(text)


def test_the_launcher_s_variables_are_what_a_rank_reads(tmp_path):
    environment = trace_environment(tmp_path, "2-3")
    request = TraceRequest.from_environment(environment)
    assert request.directory == tmp_path.resolve() / "trace" and request.steps == {2, 3}
    assert trace_environment(tmp_path, None) == {} and TraceRequest.from_environment({}) is None
    assert set(environment) == {TRACE_DIRECTORY_ENVIRONMENT, TRACE_STEPS_ENVIRONMENT}


@pytest.mark.parametrize("arguments, words", [
    (["run", "--trace-steps", "3-2"], "--trace-steps '3-2': '3-2' names no step"),
    (["compare", "--trace-steps", "x"], "--trace-steps 'x': 'x' is not a step"),
    (["run", "--trace", "--trace-steps", "7-8", "--steps", "3"], "--trace-steps 7-8 names no step of a 3-step run"),
])
def test_bad_trace_steps_are_one_line_and_exit_2(arguments, words, monkeypatch, tmp_path):
    from zero_lab.launch import torchrun_job

    monkeypatch.setattr(torchrun_job.subprocess, "Popen", lambda *args, **kwargs: pytest.fail("bad input launched"))
    result = CliRunner().invoke(app, [*arguments, "--device", "cpu", "--model", "tiny", "--out", str(tmp_path)])
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and words in lines[0], result.stderr


def train_steps(phase: StepPhase, meter: MemoryMeter, tell, steps: int) -> int:
    """Steps of a stand-in engine: each forward keeps an activation (bigger each step) inside one of
    nano's labelled regions, backward frees it and makes a gradient, the step runs a torch optimizer
    (whose first step makes its state); a unit is told gathered in forward and freed in backward, as
    `nano_moments` tells stage 3's. Returns the meter's peak over steps 2 and 3."""
    weight = torch.nn.Parameter(torch.zeros(500))
    optimizer = torch.optim.Adam([weight])
    peak = 0
    for step in range(1, steps + 1):
        phase.enter(Phase.FORWARD, step)
        tell("unit", "layer", True)
        with labelled("unit layer"):
            activation = torch.ones(1000 * step)
        phase.enter(Phase.BACKWARD)
        weight.grad = activation[:500] * 2
        del activation
        tell("unit", "layer", False)
        phase.enter(Phase.STEP)
        optimizer.step()
        weight.grad = None
        phase.enter(Phase.BETWEEN_STEPS)
        if step in (2, 3):
            peak = max(peak, meter.tracker.peak_bytes)
        meter.tracker.reset_peak()
    return peak


def test_only_the_chosen_steps_are_recorded_and_memory_peaks_where_the_meter_does(tmp_path):
    memory = MemoryMeter(torch.device("cpu"))
    memory.start()
    try:
        phase = StepPhase()
        tracing = start_tracing(TraceRequest(tmp_path, frozenset({2, 3})), CommMeter(), memory, phase,
                                torch.device("cpu"), 0)
        memory.tracker.reset_peak()
        peak = train_steps(phase, memory, tracing.timeline.observe_engine, 4)  # step 4 untraced
        tracing.close()
    finally:
        memory.stop()
    trace = json.loads((tmp_path / "trace-rank0.json").read_text())
    assert sorted(traces.step_windows(trace)) == [2, 3]
    assert [span["name"] for span in traces.spans(trace, "step")] == ["ProfilerStep#2", "ProfilerStep#3"]
    assert [span["name"] for span in traces.spans(trace, "phase")] == ["forward", "backward", "optimizer step"] * 2
    assert [span["name"] for span in traces.spans(trace, "nano")] == ["unit layer"] * 2
    assert [span["name"] for span in traces.spans(trace, "optimizer")] == ["Adam.step"] * 2
    assert [span["args"]["unit"] for span in traces.spans(trace, "unit")] == ["layer", "layer"]
    series = traces.memory_series(trace)
    windows = traces.step_windows(trace)
    assert series and all(windows[2][0] <= time <= windows[3][1] for time, _ in series)
    assert max(value for _, value in series) == peak
    # each storage is counted under the engine call that made it
    last = [event for event in trace["traceEvents"] if event.get("ph") == "C"][-1]["args"]
    assert set(last) >= {"before", "forward", "backward", "optimizer step"}
    snapshot = pickle.loads((tmp_path / "memory-snapshot-rank0.pickle").read_bytes())
    sizes = [event["size"] for event in snapshot["device_traces"][0] if event["action"] == "alloc"]
    assert 2000 * 4 in sizes and 3000 * 4 in sizes and 4000 * 4 not in sizes  # steps 2 and 3's activations only


def test_the_comm_summary_s_bandwidths_are_deepspeed_s(monkeypatch):
    """busbw equals DeepSpeed's comms logger's for every op (its message size and ms latency); its
    all-reduce 'tput' counts the tensor twice, algbw (nccl-tests') once."""
    import deepspeed.comm
    from deepspeed.utils.comms_logging import calc_bw_log

    monkeypatch.setattr(deepspeed.comm, "get_world_size", lambda *args, **kwargs: 4)
    spans = [("all_gather_into_tensor", 4 << 20, 2000.0), ("reduce_scatter_tensor", 8 << 20, 4000.0),
             ("all_reduce", 1 << 20, 1000.0), ("all_to_all_single", 2 << 20, 500.0), ("broadcast", 1 << 10, 10.0)]
    trace = {"traceEvents": [{"ph": "X", "cat": "collective", "name": op, "ts": 0.0, "dur": duration,
                              "args": {"payload_bytes": payload, "group_size": 4}} for op, payload, duration in spans]}
    rows = {row["op"]: row for row in traces.comm_summary(trace)}
    for op, payload, duration in spans:
        row = rows[op]
        tput, busbw = calc_bw_log(op.replace("_single", ""), row["message_bytes"], duration / 1e3)
        assert row["busbw_gbps"] == pytest.approx(busbw) and row["avg_latency_ms"] == pytest.approx(duration / 1e3)
        assert row["algbw_gbps"] == pytest.approx(tput / 2 if op == "all_reduce" else tput)
    assert rows["all_gather_into_tensor"]["message_bytes"] == (4 << 20) // 4  # one rank's part, as DeepSpeed prints


def test_a_storage_freed_between_traced_windows_is_forgotten_and_one_resized_there_frees_its_new_size():
    """With a gap between traced steps (`--trace-steps 1,3`) the tracker's changes in the gap are not
    recorded; a window opens with the storages alive then, so an address reused in the gap is a new
    allocation, not the free of the old one, and a storage resized in the gap frees what it holds."""
    from zero_lab.workload.tracing.memory_history import AllocationHistory

    history = AllocationHistory()
    history.changed(7, 400, 400, 1, None)  # window 1: two allocations
    history.changed(8, 40, 40, 2, None)
    history.window_opened({8: 120})  # in the gap: 7 freed (its address reused later), 8 grown to 120 B
    history.changed(7, 16, 16, 3, None)
    history.changed(8, -120, 0, 4, None)
    assert [(action, key, size) for action, key, size, _, _ in history.events] == [
        ("alloc", 7, 400), ("alloc", 8, 40), ("alloc", 7, 16), ("free_requested", 8, 120), ("free_completed", 8, 120)]


def test_asynchronous_collectives_in_flight_together_go_on_tracks_where_none_overlap(tmp_path):
    """Perfetto draws only nested slices on one track: a reduce-scatter still in flight when the next
    starts goes on a track of its own, and a track is reused once its last span has ended."""
    from zero_lab.workload.tracing.timeline import ASYNC_COLLECTIVE_TRACK, ASYNC_LANES, Timeline

    timeline = Timeline(TraceRequest(tmp_path, frozenset({1})), torch.device("cpu"), 0)
    for start, end in ((0, 10), (5, 15), (8, 20), (12, 30), (40, 50)):  # partly overlapping, as bucket reductions
        timeline._complete("reduce_scatter", "collective", start, end, ASYNC_COLLECTIVE_TRACK, {})
    made = timeline.trace_events()
    assert [event["tid"] for event in made] == [ASYNC_COLLECTIVE_TRACK, ASYNC_LANES + 1, ASYNC_LANES + 2,
                                                ASYNC_COLLECTIVE_TRACK, ASYNC_COLLECTIVE_TRACK]
    for track in {event["tid"] for event in made}:
        spans = sorted((event["ts"], event["ts"] + event["dur"]) for event in made if event["tid"] == track)
        assert all(end <= next_start for (_, end), (next_start, _) in zip(spans, spans[1:])), track
    names = {event["tid"]: event["args"]["name"] for event in timeline.document(2, "gloo", [])["traceEvents"]
             if event["name"] == "thread_name"}
    assert names[ASYNC_LANES + 2] == "collectives (asynchronous) 3"


def test_an_attempt_that_recorded_no_traced_step_keeps_the_earlier_attempts_trace(tmp_path, monkeypatch, capsys):
    """torchrun restarted the workers after the traced steps (--max-restarts): the new attempt resumes
    after them and records none; its empty trace must not replace the one that holds them."""
    from zero_lab.workload.tracing.timeline import STEP_SPAN, STEP_TRACK, Timeline
    from zero_lab.workload.tracing.trace_settings import trace_path

    request = TraceRequest(tmp_path, frozenset({2, 3}))
    first = Timeline(request, torch.device("cpu"), 0)
    for step in (2, 3):
        first._complete(f"{STEP_SPAN}{step}", "step", step * 10.0, step * 10.0 + 5, STEP_TRACK, {"step": step})
    first.write(1, "gloo", {})
    written = json.loads(trace_path(tmp_path, 0).read_text())
    assert (written["recordedSteps"], written["attempt"]) == ([2, 3], 0)
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    Timeline(request, torch.device("cpu"), 0).write(1, "gloo", {})  # resumed after step 6: nothing traced
    assert json.loads(trace_path(tmp_path, 0).read_text()) == written
    assert "trace: attempt 1 recorded none of the traced steps" in capsys.readouterr().err
