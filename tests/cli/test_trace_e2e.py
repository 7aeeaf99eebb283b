"""`zero-lab compare --trace` end to end: nano, official DeepSpeed and FSDP2 at stage 3 on the tiny model,
2 processes, 3 steps, steps 2-3 traced; one launch of the CLI (about 70 s on 2 cores) that every test
of this file reads (a module-scoped fixture).

Each rank's trace is held to references it did not write: the flight record of collectives (every call
the communication meter counted, written as it starts), the `[opt_step]` lines (bytes per step, the
measured peak), torch's memory viewer (`torch.cuda._memory_viz`) and, where installed, Holistic Trace
Analysis's parser.
"""

import json
import pickle
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from zero_lab.analysis.runs import traces
from zero_lab.analysis.report.picture import picture_data
from zero_lab.workload.meters.collective_record import read_records
from zero_lab.workload.log_contract.log_lines import MB

pytestmark = [pytest.mark.slow, pytest.mark.official]

ZERO_LAB = str(Path(sys.executable).with_name("zero-lab"))
IMPLS = ("nano", "official", "fsdp2")
TRACED = (2, 3)
COMPARE = [ZERO_LAB, "compare", "--gpus", "2", "--device", "cpu", "--model", "tiny", "--steps", "3", "--stages", "3",
           "--impls", ",".join(IMPLS), "--batch-size", "2", "--seq-len", "32", "--trace", "--trace-steps", "2-3",
           "--format", "json"]
PRINTED_MB = 0.5e-4 * MB  # the log prints MB with 4 decimals


@pytest.fixture(scope="module")
def traced(tmp_path_factory):
    out = tmp_path_factory.mktemp("runs")
    report = out / "report.md"
    done = subprocess.run([*COMPARE, "--out", str(out), "--name", "traced", "--report", str(report)],
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout), out / "traced" / "cells", report


def run_dir(cells: Path, impl: str) -> Path:
    return cells / f"w2-s3-{impl}"


def opt_steps(run: Path) -> dict[int, dict]:
    """Rank 0's `[opt_step k]` fields by step."""
    lines = {}
    for line in (run / "logs" / "rank0.stdout.log").read_text().splitlines():
        found = re.search(r"\[opt_step (\d+)\] (.*)", line)
        if found:
            lines[int(found[1])] = dict(field.split("=", 1) for field in found[2].split())
    return lines


@pytest.mark.parametrize("impl", IMPLS)
def test_every_counted_collective_is_a_span_with_its_bytes(traced, impl):
    _, cells, _ = traced
    run = run_dir(cells, impl)
    records = read_records(run / "logs")
    rank_traces = traces.read_traces(run)
    assert [trace["distributedInfo"] for trace in rank_traces] == [
        {"rank": rank, "world_size": 2, "backend": "gloo"} for rank in (0, 1)]
    sent = Counter()
    for rank, trace in enumerate(rank_traces):
        counted = Counter((call.op, call.payload_bytes, call.wire_bytes, call.step) for call in records[rank].calls
                          if call.step in TRACED and call.call != "harness" and call.op != "barrier")
        spans = Counter((span["name"], span["args"]["payload_bytes"], span["args"]["wire_bytes"], span["args"]["step"])
                        for span in traces.spans(trace, "collective"))
        assert spans == counted and counted
        for step in TRACED:
            sent[step] = max(sent[step], sum(span["args"]["payload_bytes"] for span in traces.spans(trace, "collective")
                                             if span["args"]["step"] == step))
    steps = opt_steps(run)
    assert {step: int(steps[step]["comm_bytes"]) for step in TRACED} == dict(sent)  # max over ranks, as the log


@pytest.mark.parametrize("impl", IMPLS)
def test_phases_nest_inside_their_step(traced, impl):
    _, cells, _ = traced
    for trace in traces.read_traces(run_dir(cells, impl)):
        windows = traces.step_windows(trace)
        assert sorted(windows) == list(TRACED) and trace["traceSteps"] == list(TRACED)
        phases = traces.spans(trace, "phase")
        assert [span["name"] for span in phases] == ["forward", "backward", "optimizer step"] * len(TRACED)
        autograd = traces.spans(trace, "autograd")  # torch's autograd, once inside each backward, every impl
        backwards = [phase for phase in phases if phase["name"] == "backward"]
        assert len(autograd) == len(backwards) and all(
            outer["ts"] <= inner["ts"] and inner["ts"] + inner["dur"] <= outer["ts"] + outer["dur"]
            for inner, outer in zip(autograd, backwards)), autograd
        for span in phases + traces.spans(trace, "nano") + traces.spans(trace, "collective"):
            start, end = windows[span["args"]["step"]]
            assert start <= span["ts"] <= end, span
            if not span["args"].get("asynchronous"):  # an asynchronous call's end is its work's, on another thread
                assert span["ts"] + span["dur"] <= end, span
        collectives = traces.spans(trace, "collective")
        for track in {span["tid"] for span in collectives}:  # Perfetto draws only nested slices on a track
            on_track = sorted((span["ts"], span["ts"] + span["dur"]) for span in collectives if span["tid"] == track)
            assert all(end <= following for (_, end), (following, _) in zip(on_track, on_track[1:])), track
        for span in traces.spans(trace, "nano") + traces.spans(trace, "optimizer"):  # inside their engine call
            assert any(phase["ts"] <= span["ts"] and span["ts"] + span["dur"] <= phase["ts"] + phase["dur"]
                       for phase in phases), span
        optimizer = traces.spans(trace, "optimizer")  # the optimizer's own step (official: one per sub-group)
        assert {span["args"]["step"] for span in optimizer} == set(TRACED), optimizer
        assert all(any(phase["name"] == "optimizer step" and phase["ts"] <= span["ts"] <= phase["ts"] + phase["dur"]
                       for phase in phases) for span in optimizer)
        if impl == "nano":
            names = {span["name"] for span in traces.spans(trace, "nano")}
            assert {"reduce_gradients", "unscale_clip", "all_gather"} <= names
            units = Counter(span["args"]["unit"] for span in traces.spans(trace, "unit"))
            assert units and set(units.values()) == {len(TRACED)}  # each unit gathered and released once a step
        if impl == "official":  # DeepSpeed's own timer of its stage-3 step, around torch's AdamW.step
            own = traces.spans(trace, "deepspeed")
            assert [span["name"] for span in own] == ["optimizer_step"] * len(TRACED), own
            assert all(any(span["ts"] <= inner["ts"] and inner["ts"] + inner["dur"] <= span["ts"] + span["dur"]
                           for inner in optimizer) for span in own)
        else:
            assert not traces.spans(trace, "deepspeed")


@pytest.mark.parametrize("impl", IMPLS)
def test_the_memory_counter_peaks_at_the_measured_peak(traced, impl):
    _, cells, _ = traced
    run = run_dir(cells, impl)
    highest = max(max(value for _, value in traces.memory_series(trace)) for trace in traces.read_traces(run))
    steps = opt_steps(run)
    measured = max(float(steps[step]["peak_alloc_max_mb"]) for step in TRACED) * MB
    assert abs(highest - measured) <= PRINTED_MB, (highest / MB, measured / MB)


@pytest.mark.parametrize("impl", IMPLS)
def test_the_memory_snapshot_renders_in_torch_s_viewer(traced, impl, tmp_path):
    from torch.cuda import _memory_viz

    _, cells, _ = traced
    run = run_dir(cells, impl)
    for rank, trace in enumerate(traces.read_traces(run)):
        path = run / "trace" / f"memory-snapshot-rank{rank}.pickle"
        snapshot = pickle.loads(path.read_bytes())
        events = snapshot["device_traces"][0]
        allocated = sum(event["size"] for event in events if event["action"] == "alloc")
        freed = sum(event["size"] for event in events if event["action"] == "free_completed")
        assert allocated and freed
        printed = _memory_viz.trace(snapshot)  # a line per event
        assert printed.count("\n") >= len(events) and f"{len(events)} entries" in printed
        # the segments are what was alive when the trace closed: the counter's last value
        alive = traces.memory_series(trace)[-1][1]
        assert sum(segment["total_size"] for segment in snapshot["segments"]) == alive
        flamegraph = _memory_viz.memory(snapshot, format_flamegraph=lambda lines: lines)  # the viewer's blocks
        assert sum(int(line.rsplit(" ", 1)[1]) for line in flamegraph.splitlines()) == alive
        assert "Segment size mismatch" not in _memory_viz.segsum(snapshot)
        assert any(frame["name"] == "forward" for event in events for frame in event["frames"])
        page = tmp_path / f"{impl}-{rank}.html"
        done = subprocess.run([sys.executable, "-m", "torch.cuda._memory_viz", "trace_plot", str(path), "-o", str(page)],
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        assert "add_local_files" in page.read_text()


def test_compare_json_and_report_carry_each_impl_s_communication_and_timeline(traced):
    payload, cells, report = traced
    summaries = {entry["impl"]: entry for entry in payload["comm_summary"]}
    assert set(summaries) == set(IMPLS)
    for impl, entry in summaries.items():
        rank0 = traces.read_traces(run_dir(cells, impl))[0]
        assert entry["steps"] == list(TRACED) and entry["rows"] == traces.comm_summary(rank0)
        assert sum(row["count"] for row in entry["rows"]) == len(traces.spans(rank0, "collective"))
    text = report.read_text()
    assert "## Timelines" in text and "### Timeline: world size 2, stage 3" in text
    picture = report.with_name("report-timeline-w2-s3.png")
    assert f"]({picture.name})" in text
    drawn = picture_data(picture)["data"]
    assert set(drawn) == set(IMPLS) and all(cell["step"] == TRACED[-1] for cell in drawn.values())
    for impl in IMPLS:
        assert f"Communication, {impl} (rank 0" in text


def test_holistic_trace_analysis_parses_a_zero_lab_trace(traced):
    """HTA's own parser (an optional extra: `pip install -e '.[trace]'`) reads every span and numbers the
    traced steps by their ProfilerStep spans."""
    pytest.importorskip("hta")
    from hta.common.trace import parse_trace_file

    _, cells, _ = traced
    for impl in IMPLS:
        path = run_dir(cells, impl) / "trace" / "trace-rank1.json"
        meta, frame, symbols = parse_trace_file(str(path))
        trace = json.loads(path.read_text())
        assert meta["distributedInfo"] == {"rank": 1, "world_size": 2, "backend": "gloo"}
        assert len(frame) == len(traces.spans(trace))
        collective = symbols.sym_index["collective"]
        assert (frame["cat"] == collective).sum() == len(traces.spans(trace, "collective"))
        assert set(frame.loc[frame["cat"] == collective, "iteration"]) == set(TRACED)
