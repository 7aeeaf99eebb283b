"""Render a comparison (rows, deltas, verdict) as text tables and a markdown report.

`cell_table` and `estimate_table` return plain headers and string cells, so the CLI's Rich tables
and the markdown report show the same numbers from one place.
"""

from __future__ import annotations

import json

from zero_lab.analysis.runs.speed import step_times
from zero_lab.analysis.memory.estimate import MIB, nano_bytes, paper_bytes
from zero_lab.analysis.runs.logparse import MEMORY_FIELDS
from zero_lab.analysis.runs.rundir import NEVER_STARTED
from zero_lab.analysis.compare.metrics import (NOT_TESTED_WHY, pair_parity_note, pair_parity_text, parity_text,
                                              updates_words)
from zero_lab.analysis.report.throughput_table import DEFINITION, throughput_notes, throughput_table
from zero_lab.analysis.report.version_lock import lock_note

METRIC_LABELS = {
    "alloc_max_mb": "alloc MB",
    "peak_alloc_max_mb": "peak alloc MB",
    "reserved_max_mb": "reserved MB",
    "peak_reserved_max_mb": "peak reserved MB",
}


# The wire bytes split by node (`--ranks-per-node`, docs/log-format.md "Intra- and inter-node"): label, row key.
NODE_COLUMNS = (("intra-node wire MB / step", "comm_wire_intra_mb"), ("inter-node wire MB / step", "comm_wire_inter_mb"))


def split_into_nodes(rows: list[dict]) -> bool:
    """Whether a run sent bytes to another node: `--ranks-per-node K` smaller than its world size
    (or a launch over several real nodes). With one node every wire byte is intra-node, so the
    tables leave the split out."""
    return any(row.get("comm_wire_inter_mb") for row in rows)


def fmt(value: object, digits: int = 1, signed: bool = False) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "NO"
    if isinstance(value, float):
        return f"{value:+.{digits}f}" if signed else f"{value:.{digits}f}"
    return str(value)


def first_runs(runs: list[dict]) -> list[dict]:
    """Each (world size, stage, impl) once, its first run: with `--repeat` the others log the same
    losses and tensor bytes again (their step times differ: the report's tables pool them)."""
    seen: set[tuple] = set()
    firsts = []
    for run in runs:
        key = (run["world_size"], run["stage"], run["impl"])
        if key not in seen:
            seen.add(key)
            firsts.append(run)
    return firsts


def first_rows(rows: list[dict], world_size: int, stage: int) -> dict[str, dict]:
    """impl -> the run its deltas read in the cell: its first run that logged steps (else its first)."""
    cell = [row for row in rows if (row["world_size"], row["stage"]) == (world_size, stage)]
    return {row["impl"]: row for row in first_runs(sorted(cell, key=lambda row: not row.get("steps")))}


def cell_table(rows: list[dict], delta: dict, timed: dict[tuple, dict]) -> tuple[list[str], list[list[str]]]:
    """One (world size, stage): a line per metric, candidate vs baseline, delta and delta %; the
    step time as median (IQR), its ratio with the interval, the verdict and what it rests on."""
    candidate, baseline = delta["impl"], delta["baseline"]
    cell = (delta["world_size"], delta["stage"])
    by_impl = first_rows(rows, *cell)
    headers = ["metric", candidate, baseline, "delta", "delta %"]
    body = []
    for name in MEMORY_FIELDS:
        body.append([
            METRIC_LABELS[name],
            fmt(by_impl[candidate].get(name)),
            fmt(by_impl[baseline].get(name)),
            fmt(delta[f"{name}_delta"], signed=True),
            fmt(delta[f"{name}_delta_pct"], 2, signed=True),
        ])
    body.append(["last loss", fmt(by_impl[candidate].get("loss_last"), 6), fmt(by_impl[baseline].get("loss_last"), 6),
                 fmt(delta["loss_last_delta"], 6, signed=True), ""])
    body.append(["max step loss delta", "", "", fmt(delta["max_step_loss_delta"], 8), ""])
    body.append(["step ms, median (IQR)", *(step_times.median_and_quartiles(timed.get((*cell, impl)), by_impl[impl])
                                            for impl in (candidate, baseline)),
                 fmt(delta.get("step_time_verdict")), f"ratio {step_times.ratio_and_interval(delta)}"])
    body.append(["step times measured", *(step_times.rests_on(timed.get((*cell, impl))) for impl in (candidate, baseline)),
                 "", ""])
    body.append(["comm MB / step", fmt(by_impl[candidate].get("comm_mb"), 2), fmt(by_impl[baseline].get("comm_mb"), 2),
                 fmt(delta["comm_mb_delta"], 2, signed=True), ""])
    body.append(["wire MB / step", fmt(by_impl[candidate].get("comm_wire_mb"), 2),
                 fmt(by_impl[baseline].get("comm_wire_mb"), 2), "", f"ratio {fmt(delta.get('comm_wire_ratio'), 3)}"])
    if split_into_nodes([by_impl[candidate], by_impl[baseline]]):
        for label, name in NODE_COLUMNS:
            body.append([label, fmt(by_impl[candidate].get(name), 2), fmt(by_impl[baseline].get(name), 2), "", ""])
    body.append(["loss parity", "", "", pair_parity_text(delta), ""])
    return headers, body


def placed(row: dict) -> str:
    """nano's own model-state MB after a step, device / host (official has no such count)."""
    device, host = row.get("states_device_mb"), row.get("states_host_mb")
    return "-" if device is None else f"{fmt(device)} / {fmt(host)}"


def estimate_table(rows: list[dict]) -> tuple[list[str], list[list[str]]]:
    """Measured live bytes beside the model-state formulas (nano's for the run's own model, units
    and offload, logged by the harness; else the flat formula, none at stage 3; and the paper's),
    and the measured peak beside the predicted one (model states, activations and temporaries:
    analysis.memory.peak_memory)."""
    with_host = any(row.get("states_formula_host_mb") or row.get("states_host_mb") for row in rows)
    # an fsdp2 run logs FSDP2's own formula (zero_lab/fsdp2/memory_formula.py), the others nano's
    formula = "formula MB (fsdp2: FSDP2's, else nano's)" if any(row["impl"] == "fsdp2" for row in rows) else "nano formula MB"
    headers = ["world size", "stage", "impl", "alloc MB", "peak alloc MB", formula,
               *(["nano states MB (device / host)", "nano formula host MB"] if with_host else []), "ZeRO paper MB",
               "predicted peak MB", "peak error %"]
    body = []
    for row in rows:
        params, precision = row.get("params"), row.get("precision")
        nano, host, paper = row.get("states_formula_mb"), row.get("states_formula_host_mb"), None
        if isinstance(params, int) and precision:
            stage, world_size = row["stage"], row["world_size"]
            if nano is None:
                nano_total = nano_bytes(stage, precision, params, world_size)
                nano = None if nano_total is None else nano_total["device"] / MIB
            paper = paper_bytes(stage, precision, params, world_size) / MIB
        body.append([str(row["world_size"]), str(row["stage"]), row["impl"], fmt(row.get("alloc_max_mb")),
                     fmt(row.get("peak_alloc_max_mb")), fmt(nano), *(
                         [placed(row), fmt(host)] if with_host else []), fmt(paper), fmt(row.get("predicted_peak_mb")),
                     fmt(row.get("peak_error_pct"), signed=True)])
    return headers, body


def markdown_table(headers: list[str], body: list[list[str]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(cells) + " |" for cells in body]
    return "\n".join(lines)


def verdict_lines(verdict: dict) -> list[str]:
    if verdict.get("interrupted_by"):
        status = f"INTERRUPTED ({verdict['interrupted_by']})"
    else:
        status = "PASS" if verdict["ok"] else ("RUN FAILED" if verdict["exit_code"] == 3 else "GATE FAILED")
    lines = [f"**Verdict: {status}** - loss parity: {parity_text(verdict)} (tolerance {verdict['loss_tol']:g})"]
    if verdict.get("fail_on_regression_pct") is not None:
        lines[0] += f"; regression gate: +{verdict['fail_on_regression_pct']:g}% (memory; step time when slower)"
    if verdict.get("resume_updates_compared") is not None:
        exact = verdict["resume_exact"]
        lines[0] += "; exact resume: " + ("NO" if exact is False else "not tested" if exact is None else
                                          f"yes over {updates_words(verdict['resume_updates_compared'])}")
    not_tested = verdict.get("loss_parity_not_tested") or []
    problems = (verdict["failed_runs"] + verdict["loss_parity_failures"] + not_tested
                + ([NOT_TESTED_WHY] if not_tested else []) + verdict["memory_regressions"]
                + verdict.get("step_time_regressions", []) + verdict.get("resume_failures", [])
                + verdict.get("not_run", []))
    return lines + [f"- {problem}" for problem in problems]


def dict_differences(left: dict, right: dict, prefix: str = "") -> list[tuple[str, object, object]]:
    """(dotted key, left value, right value) for every leaf that differs."""
    differences = []
    for key in sorted(set(left) | set(right), key=str):
        a, b = left.get(key), right.get(key)
        name = f"{prefix}{key}"
        if isinstance(a, dict) and isinstance(b, dict):
            differences += dict_differences(a, b, f"{name}.")
        elif a != b:
            differences.append((name, a, b))
    return differences


def config_section(summaries: list[dict], candidate: str, baseline: str) -> str:
    """The `[zero]` headers and configs of the first cell with both impls, side by side."""
    by_impl = {s["impl"]: s for s in summaries}
    if candidate not in by_impl or baseline not in by_impl:
        return ""
    left, right = by_impl[candidate], by_impl[baseline]
    body = [[f"[zero] {key}", fmt(a), fmt(b)] for key, a, b in dict_differences(left.get("zero", {}), right.get("zero", {}))
            if key not in ("impl",)]
    body += [[f"config {key}", json.dumps(a), json.dumps(b)]
             for key, a, b in dict_differences(left.get("config", {}), right.get("config", {}))]
    if not body:
        return "No differences in the `[zero]` headers or configs.\n"
    return markdown_table(["setting", candidate, baseline], body) + "\n"


def environment_section(environment: dict) -> str:
    """The run's environment, then which of its versions differ from the lock (`version_lock`)."""
    body = [[key, fmt(value)] for key, value in environment.items()]
    note = lock_note(environment)
    return markdown_table(["", "value"], body) + "\n" + (f"\n{note}\n" if note else "")


def cell_tables(rows: list[dict], deltas: list[dict],
                step_times: list[dict] | None = None) -> list[tuple[str, list[str], list[list[str]]]]:
    """(title, headers, body) per cell: two impls as `cell_table`; three or more as one table with
    a column per impl, each candidate's delta % against the baseline, and loss parity pairwise.
    step_times: compare.json's per cell and impl (none: each run's own step ms)."""
    timed = {(entry["world_size"], entry["stage"], entry["impl"]): entry for entry in step_times or []}
    cells: dict[tuple, list[dict]] = {}
    for delta in deltas:
        cells.setdefault((delta["world_size"], delta["stage"]), []).append(delta)
    tables = []
    for (world_size, stage), pairs in cells.items():
        against = [delta for delta in pairs if delta.get("against_baseline", True)]
        if len(against) == 1 and len(pairs) == 1:
            title = f"world size {world_size}, stage {stage}: {against[0]['impl']} vs {against[0]['baseline']}"
            tables.append((title, *cell_table(rows, against[0], timed)))
            continue
        baseline = against[0]["baseline"]
        title = f"world size {world_size}, stage {stage}: {', '.join(d['impl'] for d in against)} vs {baseline}"
        tables.append((title, *impls_table(rows, against, pairs, timed)))
    return tables


def impls_table(rows: list[dict], against: list[dict], pairs: list[dict],
                timed: dict[tuple, dict]) -> tuple[list[str], list[list[str]]]:
    """One cell with several candidates: values per impl, delta % against the baseline."""
    baseline = against[0]["baseline"]
    impls = [delta["impl"] for delta in against] + [baseline]
    cell = (against[0]["world_size"], against[0]["stage"])
    by_impl = first_rows(rows, *cell)
    headers = ["metric", *impls, *(f"{delta['impl']} delta %" for delta in against)]
    body = [[METRIC_LABELS[name], *(fmt(by_impl[impl].get(name)) for impl in impls),
             *(fmt(delta[f"{name}_delta_pct"], 2, signed=True) for delta in against)] for name in MEMORY_FIELDS]
    body.append(["last loss", *(fmt(by_impl[impl].get("loss_last"), 6) for impl in impls), *([""] * len(against))])
    body.append(["step ms, median (IQR)", *(step_times.median_and_quartiles(timed.get((*cell, impl)), by_impl[impl])
                                            for impl in impls),
                 *(f"ratio {step_times.ratio_and_interval(delta)} {fmt(delta.get('step_time_verdict'))}" for delta in against)])
    body.append(["step times measured", *(step_times.rests_on(timed.get((*cell, impl))) for impl in impls),
                 *([""] * len(against))])
    body.append(["comm MB / step", *(fmt(by_impl[impl].get("comm_mb"), 2) for impl in impls), *([""] * len(against))])
    body.append(["wire MB / step", *(fmt(by_impl[impl].get("comm_wire_mb"), 2) for impl in impls),
                 *(f"ratio {fmt(delta.get('comm_wire_ratio'), 3)}" for delta in against)])
    for delta in pairs:  # loss parity, pairwise
        label = f"max step loss delta {delta['impl']} vs {delta['baseline']}"
        body.append([label, *([""] * len(impls)), *([""] * (len(against) - 1)),
                     f"{fmt(delta['max_step_loss_delta'], 8)} ({pair_parity_note(delta)})"])
    return headers, body


def failure_section(rows: list[dict]) -> str:
    parts = []
    for row in rows:
        if row["status"] in ("ok", *NEVER_STARTED):  # a cell that never started has no logs; the verdict says why
            continue
        parts.append(
            f"#### world size {row['world_size']}, stage {row['stage']}, {row['impl']}: {row['status']}"
            + (" (out of memory)" if row.get("failure") == "out_of_memory" else "") + "\n\n"
            + (f"{row['error']}\n\n" if row.get("error") else "")
            + f"rank {fmt(row.get('failed_rank'))}, exit code {fmt(row.get('exit_code'))}, "
            f"logs in `{row.get('run_dir', '?')}`\n\n```\n{row.get('log_tail', '')}\n```\n"
        )
    return "\n".join(parts)


def render_report(comparison: dict, summaries: list[dict], title: str, plots: list[str]) -> str:
    """The whole markdown report; plot paths are relative to the report."""
    rows, deltas = comparison["rows"], comparison["deltas"]
    out = [f"# {title}", "", *verdict_lines(comparison["verdict"]), ""]
    if deltas:
        out += [step_times.READING, ""]
    for title, headers, body in cell_tables(rows, deltas, comparison.get("step_times")):
        out += [f"## {title}", "", markdown_table(headers, body), ""]
    out += ["## Runs", "", markdown_table(*run_table(rows)), ""]
    if any(row.get("steps") and "flops_per_token" in row for row in rows):  # summaries that measured it
        out += ["## Throughput", "", DEFINITION, "", markdown_table(*throughput_table(rows)), "",
                *(f"{note}\n" for note in throughput_notes(rows))]
    out += ["## Measured memory against model-state estimates", "",
            "`alloc` is the live tensor bytes when the harness samples them and `peak alloc` the peak within a "
            "step (activations and temporary buffers included; see docs/log-format.md); the formulas count "
            "model states only: parameters, gradients and optimizer states. The predicted peak adds the "
            "activations of one micro-batch, the loss's temporaries and the gradient buckets to nano's formula "
            "(official DeepSpeed at stages 1-2: its staging buffer and fp32 copy, and at its step its gradient "
            "partition in the parameters' dtype, the fp32 cast of it and its optimizer's temporaries; at stage 3: "
            "its gradient partitions and reduce bucket, allocated at start; "
            "`zero-lab estimate`, docs/cli.md); its error is (predicted - measured) / measured.", "",
            markdown_table(*estimate_table(first_runs(rows))), ""]
    failures = failure_section(rows)
    if failures:
        out += ["## Failed runs", "", failures]
    if deltas:
        first = deltas[0]
        cell = [s for s in summaries if (s["world_size"], s["stage"]) == (first["world_size"], first["stage"])]
        out += [f"## Config differences ({first['impl']} vs {first['baseline']})", "",
                config_section(cell, first["impl"], first["baseline"])]
    out += [f"![{name}]({name})" for name in plots] + ([""] if plots else [])
    environment = next((s["env"] for s in summaries if s.get("env")), None)
    if environment:
        out += ["## Environment", "", environment_section(environment)]
    return "\n".join(out)


def status_text(row: dict) -> str:
    """A run's status in a table; a cell that never started says why ("needs 2 GPUs (1 visible)",
    "refused: would not fit"; the verdict gives the refusal's figures)."""
    if row["status"] == "refused":
        return "refused: would not fit"
    return row["error"] if row["status"] == "not_run" else row["status"] + restarts_text(row)


def restarts_text(row: dict) -> str:
    """', 1 restart' after the status of a run torchrun restarted (`--max-restarts`), else nothing."""
    count = row.get("restarts") or 0
    return f", {count} restart{'s' if count > 1 else ''}" if count else ""


def run_table(rows: list[dict]) -> tuple[list[str], list[list[str]]]:
    """A line per run, for the console and the report; with `--repeat`, which run of its impl and
    cell it was; with runs split into nodes, the intra- and inter-node wire bytes after the wire
    bytes they split."""
    nodes = NODE_COLUMNS if split_into_nodes(rows) else ()
    repeated = any((row.get("repeat") or 1) > 1 for row in rows)
    headers = ["world size", "stage", "impl", *(["run"] if repeated else []), "optimizer", "status", "steps",
               "last loss", "alloc MB", "peak alloc MB",
               "step ms", "comm MB / step", "wire MB / step", *(label for label, _ in nodes)]
    body = [[str(r["world_size"]), str(r["stage"]), r["impl"], *([fmt(r.get("repeat"))] if repeated else []),
             r.get("optimizer") or "-", status_text(r), fmt(r.get("steps")),
             fmt(r.get("loss_last"), 6), fmt(r.get("alloc_max_mb")), fmt(r.get("peak_alloc_max_mb")),
             fmt(r.get("step_ms")), fmt(r.get("comm_mb"), 2), fmt(r.get("comm_wire_mb"), 2),
             *(fmt(r.get(name), 2) for _, name in nodes)] for r in rows]
    return headers, body
