"""The layout of a run directory: writing its summary.json, and reading it back (`report`, `compare`).

    runs/<run-id>/
        command.txt        the exact torchrun command, shell-quoted
        config.json        the DeepSpeed config this impl was given (stage set for this run)
        config.official.json  for --impl official: what official DeepSpeed received after conversion
        console.log        torchrun's own output and rank 0's stdout, as it streamed
        logs/rank<k>.stdout.log, logs/rank<k>.stderr.log   every local rank's full output
        logs/collectives-rank<k>.bin   every local rank's flight record of collectives (`workload.meters.collective_record`)
        metrics.csv        one row per [opt_step]
        memory.csv         every rank's resident memory and the memory available, sampled while it ran
        summary.json       the row `compare` reports, plus headers, collectives and warnings
        env.json           versions, device, CPU/GPU model

    runs/<compare-id>/compare.json, and one run directory per cell under runs/<compare-id>/cells/.

The launcher moves the rank logs in (`collect_rank_logs`) and hands over how the run ended;
`summarize` parses rank 0's log, writes metrics.csv and builds the summary: status, measured
figures, nano's predictions beside them; `write_summary` saves it.

A run or comparison gets its directory from `claim`, which creates it and fails if it exists, so
two commands started in the same second can never share one.
"""

from __future__ import annotations

import csv
import errno
import itertools
import json
import os
import re
import shutil
import signal
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

from zero_lab.analysis.runs.logparse import STEP_FIELDS, ParsedLog, is_number, parse_file
from zero_lab.analysis.memory.peak_memory import error_percent, predict_run_peak
from zero_lab.analysis.runs.restart_history import restart_record
from zero_lab.analysis.runs.speed.step_phases import last_step_phases
from zero_lab.analysis.runs.speed.throughput import throughput
from zero_lab.analysis.runs.updates import step_updates
from zero_lab.nano.dtypes import PRECISION_OF_DTYPE_NAME
from zero_lab.workload.log_contract.log_lines import MB
from zero_lab.workload.faults.out_of_memory import EXIT_OUT_OF_MEMORY, MESSAGE_PREFIX

SUMMARY = "summary.json"
COMPARE = "compare.json"
# The launcher's verdict on a rank it saw killed: (failed rank, its exit code) -> why, or None.
KilledForMemory = Callable[[int | None, int | None], "str | None"]


def timestamp(now: datetime | None = None) -> str:
    return (now or datetime.now()).strftime("%Y%m%d-%H%M%S")


def cell_name(impl: str, stage: int, world_size: int) -> str:
    return f"w{world_size}-s{stage}-{impl}"


def claim(parent: Path, name: str, numbered: bool = False) -> Path:
    """Create parent/name, which must not exist yet, and return it.

    Creating the directory is the one atomic step: of two commands that computed the same name
    (a default name is a timestamp to the second), exactly one gets it. numbered: the other takes
    name-2, name-3, ... instead; else it gets FileExistsError. A parent that cannot be created
    raises another OSError (NotADirectoryError where a file stands in the way).
    """
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except FileExistsError:  # a file where a directory of the path should be
        raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), str(parent)) from None
    for attempt in itertools.count(1):
        path = parent / (name if attempt == 1 else f"{name}-{attempt}")
        try:
            path.mkdir()
            return path
        except FileExistsError:
            if not numbered:
                raise


def holds_a_run(directory: Path) -> bool:
    """Whether a run started under directory: every launched run writes its summary.json, also
    when it failed or was interrupted."""
    return any(directory.rglob(SUMMARY))


def collect_rank_logs(torchrun_log_dir: Path, destination: Path) -> list[Path]:
    """Move torchrun's `<job>/attempt_<a>/<rank>/std{out,err}.log` to `logs/rank<k>.<stream>.log`; after
    a restart (`--max-restarts`) each rank's file holds its attempts one after another, in order."""
    destination.mkdir(parents=True, exist_ok=True)
    moved = []
    for source in sorted(torchrun_log_dir.glob("*/attempt_*/*/std*.log"), key=attempt_order):
        target = destination / f"rank{source.parent.name}.{source.stem}.log"
        if target in moved:  # a later attempt of the same rank
            with open(target, "ab") as sink, open(source, "rb") as attempt:
                shutil.copyfileobj(attempt, sink)
            continue
        shutil.move(str(source), target)
        moved.append(target)
    shutil.rmtree(torchrun_log_dir, ignore_errors=True)
    return moved


def attempt_order(path: Path) -> tuple:
    """Sort key of a torchrun log `<job>/attempt_<a>/<rank>/<stream>.log`: attempt 10 after attempt 9."""
    return (path.parent.parent.parent.name, int(path.parent.parent.name.removeprefix("attempt_")),
            path.parent.name, path.name)


def write_metrics_csv(path: Path, parsed: ParsedLog) -> None:
    extra = sorted({key for row in parsed.steps for key in row} - {"step", *STEP_FIELDS})
    columns = ["step", *STEP_FIELDS, *extra]
    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=columns, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(parsed.steps)


def write_json(path: Path, payload: object) -> None:
    path.write_text(json.dumps(payload, indent=2, default=str) + "\n")


def read_json(path: Path) -> dict:
    """A JSON object this package wrote (summary.json, compare.json); ValueError naming the file when
    it holds something else (cut short, emptied or edited by hand), never a traceback further on."""
    again = "run the command that wrote it again, or move that directory aside"
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise ValueError(f"{path} is not UTF-8 text; {again}") from None
    except json.JSONDecodeError as error:
        raise ValueError(f"{path} is not valid JSON ({error.msg} at line {error.lineno}); {again}") from None
    if not isinstance(value, dict):
        raise ValueError(f"{path} holds a JSON {type(value).__name__}, not the object zero-lab writes; {again}")
    return value


def failure_from_console(console_text: str) -> dict[str, int | None]:
    """torchrun's root-cause block names the failing rank and its exit code."""
    console_text = console_text[console_text.rfind("Root Cause"):]
    rank = re.search(r"rank\s*:\s*(\d+)", console_text)
    code = re.search(r"exitcode\s*:\s*(-?\d+)", console_text)
    return {
        "failed_rank": int(rank.group(1)) if rank else None,
        "rank_exit_code": int(code.group(1)) if code else None,
    }


def who_exited(failed_rank, code) -> str:
    """'rank 1 exited with -6 (SIGABRT)'; without a rank (torchrun names none when its own agent died,
    as a kill of the launcher leaves it) 'the launch (torchrun) exited with -9 (SIGKILL)'."""
    code = int(code)
    killed = f" ({signal.Signals(-code).name})" if code < 0 and -code in signal.valid_signals() else ""
    who = f"rank {failed_rank}" if failed_rank is not None else "the launch (torchrun)"
    return f"{who} exited with {code}{killed}"


def log_tail(paths: list[Path], lines: int = 20) -> str:
    """The last lines of the first stderr log that has any, else of the first log."""
    candidates = sorted(paths, key=lambda p: (".stderr" not in p.name, p.name))
    for path in candidates:
        text = path.read_text(errors="replace").strip()
        if text:
            return "\n".join(text.splitlines()[-lines:])
    return ""


def find_summaries(paths: list[Path]) -> list[Path]:
    """Every summary.json in or below the given run/compare directories, in a stable order."""
    found = []
    for path in paths:
        if (path / SUMMARY).is_file():
            found.append(path / SUMMARY)
        else:
            found.extend(sorted(path.rglob(SUMMARY)))
    return found


def losses_of(summary: dict) -> dict[int, float]:
    """Per-step losses as saved in summary.json (JSON keys are strings)."""
    return {int(step): float(loss) for step, loss in summary.get("losses", {}).items()}


def step_times_of(summary: dict) -> dict[int, float]:
    """Per-step times (`step_ms`) as saved in summary.json; empty for a summary without them."""
    return {int(step): float(ms) for step, ms in (summary.get("step_times_ms") or {}).items()}


def rank0_log(run_dir: Path) -> Path:
    """Where a run's `[opt_step]` lines are: rank 0's stdout, else torchrun's console (a run cut
    off before its rank logs were gathered)."""
    rank0 = run_dir / "logs" / "rank0.stdout.log"
    return rank0 if rank0.is_file() else run_dir / "console.log"


def harness_line(rank_logs: list[Path], prefix: str, rank: int | None = None) -> str | None:
    """The last line starting with prefix in the first rank stderr log that has one (rank's own first)."""
    for path in sorted(rank_logs, key=lambda path: (not path.name.startswith(f"rank{rank}."), path.name)):
        if path.name.endswith(".stderr.log"):
            lines = [line for line in path.read_text(errors="replace").splitlines() if line.startswith(prefix)]
            if lines:
                return lines[-1]
    return None


def bad_input_message(rank_logs: list[Path], rank_exit_code: int | None) -> str | None:
    """The harness's own one-line `error: ...` when it refused its input (exit code 2)."""
    if rank_exit_code != 2:
        return None
    line = harness_line(rank_logs, "error:")
    return line.removeprefix("error:").strip() if line else None


def out_of_memory_message(rank_logs: list[Path], failure: dict,
                          killed_for_memory: KilledForMemory | None = None) -> str | None:
    """Why a rank ran out of memory: the harness's own `out of memory: ...` line (exit code
    EXIT_OUT_OF_MEMORY: the allocator refused), or the launcher's verdict on a rank killed by SIGKILL."""
    if failure["rank_exit_code"] == EXIT_OUT_OF_MEMORY:
        return harness_line(rank_logs, MESSAGE_PREFIX, failure["failed_rank"])
    return killed_for_memory(failure["failed_rank"], failure["rank_exit_code"]) if killed_for_memory else None


def number_or_none(value: object) -> float | None:
    return float(value) if is_number(value) else None


def resident_figures(prediction, impl: str, device: str, measured_mb: float | None,
                     beside_after_initialize_mb: float | None) -> dict:
    """What the machine limits, predicted beside what the run measured (`peak_reserved_max_mb`). On CPU,
    `predicted_resident_mb` and `resident_error_pct`: the predicted peak less what it allocates and never
    writes, plus what the heap keeps and what the rank held beside its tensors once its engine was built
    (the `[model]` line) where it says. On CUDA, `predicted_reserved_mb` and `reserved_error_pct`: the
    device's predicted peak and what the caching allocator keeps cached beside it. None elsewhere, or
    without a prediction."""
    from zero_lab.analysis.memory.resident import predicted_resident_bytes

    figures = {"predicted_resident_mb": None, "resident_error_pct": None,
               "predicted_reserved_mb": None, "reserved_error_pct": None}
    if prediction is None:
        return figures
    read = beside_after_initialize_mb is not None and device != "cuda"
    beside = int(beside_after_initialize_mb * MB) if read else None
    predicted = predicted_resident_bytes(prediction, impl, device, beside) / MB
    unit = "reserved" if device == "cuda" else "resident"
    return figures | {f"predicted_{unit}_mb": predicted, f"{unit}_error_pct": error_percent(predicted, measured_mb)}


def summarize(run_dir: Path, rank_logs: list[Path], *, impl: str, stage: int, dtype: str, offload: str,
              launched_world_size: int, exit_code: int, interrupted_by: str | None, duration_s: float,
              stalled: str | None = None, killed_for_memory: KilledForMemory | None = None,
              rss_max_mb: float | None = None, peak_tflops: float | None = None) -> dict:
    """A finished run's summary.json, from its directory (rank 0's log, console.log) and how it ended.

    Phase 1: parse rank 0's log; write metrics.csv.
    Phase 2: the status: interrupted_by (the signal that stopped it), stalled (the stall watch's
             message), else the exit code; a failed run's bad input or out-of-memory cause, from
             the harness's own lines or killed_for_memory(failed rank, its exit code), the
             launcher's verdict on a rank killed by SIGKILL.
    Phase 3: the measured figures (analysis.runs.tables) beside nano's predictions (the peak, the
             model-state formula), and the throughput as tokens/s per device, TFLOP/s and MFU
             against peak_tflops (--peak-tflops; None: the known GPUs' table, `runs.throughput`)."""
    from zero_lab.analysis.runs.tables import summarize_run  # pandas: once the run has ended
    from zero_lab.workload.meters.parameter_norms import PARAMETER_NORMS_FILE, read_norms  # torch

    parsed = parse_file(rank0_log(run_dir))  # Phase 1
    write_metrics_csv(run_dir / "metrics.csv", parsed)
    failure = failure_from_console((run_dir / "console.log").read_text(errors="replace"))  # Phase 2
    if failure["rank_exit_code"] is None and exit_code < 0:  # no rank named: the launch itself was killed
        failure["rank_exit_code"] = exit_code
    status = "interrupted" if interrupted_by else "stalled" if stalled else "ok" if exit_code == 0 else "failed"
    bad_input = bad_input_message(rank_logs, failure["rank_exit_code"]) if status == "failed" else None
    if bad_input:
        status = "bad_input"
    out_of_memory = out_of_memory_message(rank_logs, failure, killed_for_memory) if status == "failed" else None
    params = parsed.model.get("params")  # Phase 3
    world_size = parsed.zero.get("world_size") or parsed.rank.get("world_size") or launched_world_size
    precision = PRECISION_OF_DTYPE_NAME.get(dtype, dtype)
    prediction = predict_run_peak(parsed.model, parsed.zero, stage, precision, int(world_size))
    measured = summarize_run(parsed)
    # like with like: on CUDA the allocator measures the device alone, on CPU every tensor
    device_type = str(parsed.model.get("device") or "cpu")
    predicted_peak_mb = prediction.peak_seen_on(device_type) / MB if prediction else None
    elsewhere = parsed.rank.get("global_rank") not in (None, 0, 0.0)
    return {
        "world_size": int(world_size),
        "note": (f"global rank 0 ran on another node: its [opt_step] lines and losses are in that node's run "
                 f"directory (this node ran global rank {int(parsed.rank['global_rank'])} and its local peers)")
        if elsewhere else None,
        "stage": stage,
        "impl": impl,
        "status": status,
        **measured,
        **throughput(measured["tokens_per_s"], int(world_size), parsed.model, peak_tflops),
        "predicted_peak_mb": predicted_peak_mb,
        "peak_error_pct": error_percent(predicted_peak_mb, measured["peak_alloc_max_mb"]),
        # the host's share of the prediction (offload): inside predicted_peak_mb on CPU, beside it on CUDA
        "predicted_host_peak_mb": prediction.peak_in("host") / MB if prediction else None,
        # on CPU the resident peak of a rank, predicted (analysis.memory.resident) beside the measured one (VmHWM)
        **resident_figures(prediction, impl, device_type, measured.get("peak_reserved_max_mb"),
                           number_or_none(parsed.model.get("rss_beside_tensors_mb"))),
        # on CPU what a rank held resident beside its tensors once the engine was built ([model] line)
        "rss_beside_tensors_mb": number_or_none(parsed.model.get("rss_beside_tensors_mb")),
        "exit_code": exit_code,
        **(failure if status in ("failed", "bad_input") else {"failed_rank": None, "rank_exit_code": None}),
        "interrupted_by": interrupted_by,
        "error": bad_input or stalled or out_of_memory,
        "failure": "out_of_memory" if out_of_memory else None,
        # the largest resident set of any local rank, sampled while the run lasted (memory.csv)
        "rss_max_mb": rss_max_mb,
        "log_tail": "" if status in ("ok", "interrupted") else log_tail(rank_logs or [run_dir / "console.log"]),
        "params": params if isinstance(params, int) and not isinstance(params, bool) else None,
        # the torch optimizer the impl stepped with (the harness's [model] line): FusedAdam, torch.optim.AdamW, ...
        "optimizer": parsed.model.get("optimizer"),
        "precision": precision,
        "offload": offload,
        # nano's model-state formula for this workload, per rank (the harness's [model] line)
        "states_formula_mb": number_or_none(parsed.model.get("states_formula_mb")),
        "states_formula_host_mb": number_or_none(parsed.model.get("states_formula_host_mb")),
        "duration_s": round(duration_s, 1),
        "run_dir": str(run_dir),
        "skipped_lines": parsed.skipped_lines,
        "warnings": parsed.warnings,
        "zero": parsed.zero,
        "model": parsed.model,
        "comm": parsed.comm,
        "phases": last_step_phases(parsed.phases),
        "losses": {str(step): loss for step, loss in parsed.losses().items()},
        # per step, the update it made: its learning rate, applied or skipped, parameters moved
        "updates": step_updates(parsed.steps, read_norms(run_dir / "logs" / PARAMETER_NORMS_FILE)[0]),
        # every step's time, for the step-time intervals of `compare` (analysis.runs.speed.step_times)
        "step_times_ms": {str(row["step"]): row["step_ms"] for row in parsed.steps if is_number(row.get("step_ms"))},
        # torchrun's restarts of the workers (--max-restarts): how many, each one, the steps run twice
        **restart_record((run_dir / "console.log").read_text(errors="replace"), parsed),
    }


# The statuses of a cell that never started: `not_run` (its world size needs more GPUs than are
# visible) and `refused` (the preflight predicted it would not fit in memory). Neither failed.
NEVER_STARTED = ("not_run", "refused")


def not_run_summary(world_size: int, stage: int, impl: str, reason: str, status: str = "not_run") -> dict:
    """The row of a cell that never started, and why (`compare --gpus` beyond the visible GPUs, or a
    cell refused before launch): its status (NEVER_STARTED), no steps, the reason as its error."""
    return {"world_size": world_size, "stage": stage, "impl": impl, "status": status, "error": reason, "steps": 0}


def write_summary(run_dir: Path, summary: dict) -> None:
    write_json(run_dir / SUMMARY, summary)
