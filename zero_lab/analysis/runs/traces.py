"""Read the timelines `--trace` wrote (`workload.tracing.timeline`) back into spans and summaries.

Phase 1: `read_traces(run_dir)` loads every rank's `trace-rank<N>.json` of a run, in rank order.
Phase 2: `spans`, `memory_series` and `step_windows` take a trace apart; `comm_summary` adds up its
         collective spans in the shape of DeepSpeed's comms logger (`deepspeed.comm.log_summary`):
         per op and message size the count, total and average latency, algbw and busbw.

Bandwidths follow nccl-tests' conventions (its doc/PERFORMANCE.md), which DeepSpeed's comms logger
also uses: a call of S bytes on n ranks in t seconds has algbw = S / t, and busbw = algbw x
2(n-1)/n for an all-reduce, algbw x (n-1)/n for an all-gather, a reduce-scatter and an all-to-all,
algbw for the rest (broadcast, reduce). S is nccl-tests' size: the whole output of an all-gather,
the whole input of a reduce-scatter, the tensor of an all-reduce, which is the payload the
communication meter counts. DeepSpeed prints the message size of an all-gather or a reduce-scatter
as one rank's part (S / n), and so does this summary; DeepSpeed's busbw is the same figure as
this one for every op, its all-reduce "tput" is 2 S / t. Both print Gbps (10^9 bits per second).
Latency is a span's length: a synchronous call from its call to its return, an asynchronous one
from its call to the completion of its work.
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from pathlib import Path

from zero_lab.workload.meters.wire_bytes import bus_factor, family_of_name
from zero_lab.workload.tracing.trace_settings import TRACE_DIRECTORY

TRACE_FILE = re.compile(r"trace-rank(\d+)\.json$")
MEMORY_COUNTER = "allocated bytes"
SPLIT_MESSAGE = ("all_gather", "reduce_scatter")  # DeepSpeed's message size: one rank's part


def trace_directory(run_dir: Path) -> Path:
    return Path(run_dir) / TRACE_DIRECTORY


def read_traces(run_dir: Path) -> list[dict]:
    """Phase 1: every rank's trace of a run, in rank order (empty: the run was not traced)."""
    directory = trace_directory(run_dir)
    files = sorted((int(match.group(1)), path) for path in directory.glob("trace-rank*.json")
                   if (match := TRACE_FILE.search(path.name))) if directory.is_dir() else []
    return [json.loads(path.read_text()) for _, path in files]


def spans(trace: dict, category: str | None = None) -> list[dict]:
    """The complete events ("X") of a trace, of one category when given, in time order."""
    return [event for event in trace["traceEvents"] if event.get("ph") == "X"
            and (category is None or event.get("cat") == category)]


def memory_series(trace: dict) -> list[tuple[float, int]]:
    """(time in us, allocated bytes: the sum over categories) at every change of the memory counter."""
    return [(event["ts"], sum(event["args"].values())) for event in trace["traceEvents"]
            if event.get("ph") == "C" and event.get("name") == MEMORY_COUNTER]


def family(op: str) -> str:
    """The collective an op name implements (`all_gather_into_tensor` -> all_gather; the families
    are `workload.meters.wire_bytes`'s); a name of no family stays itself."""
    return family_of_name(op) or op


def bandwidths(op: str, size: int, seconds: float, world_size: int) -> tuple[float, float]:
    """(algbw, busbw) in Gbps of one call that moved `size` bytes (nccl-tests' size) in `seconds`."""
    if seconds <= 0:
        return 0.0, 0.0
    algbw = size * 8 / seconds / 1e9
    return algbw, algbw * bus_factor(op, world_size)


def message_size(op: str, payload: int, group_size: int) -> int:
    """The message size DeepSpeed's comms logger prints for a call of `payload` bytes."""
    return payload // group_size if family(op) in SPLIT_MESSAGE and group_size else payload


def comm_summary(trace: dict) -> list[dict]:
    """Phase 2: one row per (op, message size), in the comms logger's columns, ops in name order."""
    groups: dict[tuple[str, int], list[dict]] = defaultdict(list)
    for span in spans(trace, "collective"):
        args = span["args"]
        groups[(span["name"], message_size(span["name"], args["payload_bytes"], args["group_size"]))].append(span)
    rows = []
    for (op, size), calls in sorted(groups.items()):
        latencies = [call["dur"] / 1e3 for call in calls]  # ms
        rates = [bandwidths(op, call["args"]["payload_bytes"], call["dur"] / 1e6, call["args"]["group_size"])
                 for call in calls]
        rows.append({"op": op, "message_bytes": size, "count": len(calls),
                     "total_latency_ms": sum(latencies), "avg_latency_ms": sum(latencies) / len(calls),
                     "algbw_gbps": sum(rate[0] for rate in rates) / len(rates),
                     "busbw_gbps": sum(rate[1] for rate in rates) / len(rates)})
    return rows


def step_windows(trace: dict) -> dict[int, tuple[float, float]]:
    """Each traced step's (start, end) in us, from its step span."""
    return {event["args"]["step"]: (event["ts"], event["ts"] + event["dur"]) for event in spans(trace, "step")}


def phase_totals(trace: dict) -> dict[str, float]:
    """Milliseconds per engine call (forward, backward, optimizer step), the optimizer's own step and
    nano's phases (a label's first word: "unit", "bucket", "reduce_gradients"), over the traced steps."""
    totals: dict[str, float] = defaultdict(float)
    for span in spans(trace, "phase") + spans(trace, "optimizer") + spans(trace, "nano"):
        name = span["name"] if span["cat"] == "phase" else span["name"].split(" ")[0]
        totals[name] += span["dur"] / 1e3
    return dict(totals)
