"""The traced runs of a comparison in its report and JSON: a timeline per cell, and per impl the
communication summary in DeepSpeed's comms-logger shape (`analysis.runs.traces`).

    comm_summaries(summaries)            [{world_size, stage, impl, rows: [...]}]: compare's JSON
    timeline_section(summaries, report)  the report's "Timelines" section, pictures written beside it
Each impl's first run of a cell is read (with --repeat the others trace the same steps again), and
its rank 0's trace gives the summary, as DeepSpeed's `log_summary` prints rank 0's.
"""

from __future__ import annotations

from pathlib import Path

from zero_lab.analysis.runs import traces
from zero_lab.analysis.report.markdown import first_runs, markdown_table

SUMMARY_HEADERS = ["Comm. Op", "Message Size", "Count", "Total Latency(ms)", "Avg Latency(ms)", "algbw (Gbps)",
                   "busbw (Gbps)"]


def traced_runs(summaries: list[dict]) -> dict[tuple[int, int], list[tuple[str, list[dict]]]]:
    """(world size, stage) -> [(impl, its ranks' traces)] for every first run that was traced."""
    cells: dict[tuple[int, int], list[tuple[str, list[dict]]]] = {}
    for summary in first_runs(summaries):
        rank_traces = traces.read_traces(Path(summary["run_dir"])) if summary.get("run_dir") else []
        if rank_traces:
            cells.setdefault((summary["world_size"], summary["stage"]), []).append((summary["impl"], rank_traces))
    return cells


def comm_summaries(summaries: list[dict]) -> list[dict]:
    """compare's JSON `comm_summary`: per traced run, rank 0's rows (empty: nothing was traced)."""
    return [{"world_size": world_size, "stage": stage, "impl": impl, "steps": rank_traces[0].get("traceSteps"),
             "rows": traces.comm_summary(rank_traces[0])}
            for (world_size, stage), runs in sorted(traced_runs(summaries).items()) for impl, rank_traces in runs]


def summary_table(rows: list[dict]) -> str:
    body = [[row["op"], str(row["message_bytes"]), str(row["count"]), f"{row['total_latency_ms']:.2f}",
             f"{row['avg_latency_ms']:.3f}", f"{row['algbw_gbps']:.2f}", f"{row['busbw_gbps']:.2f}"] for row in rows]
    return markdown_table(SUMMARY_HEADERS, body)


def phase_table(runs: list[tuple[str, list[dict]]]) -> str:
    """ms per traced step of each engine call and nano phase, rank 0, one column per impl."""
    totals = {impl: traces.phase_totals(rank_traces[0]) for impl, rank_traces in runs}
    steps = {impl: max(1, len(traces.step_windows(rank_traces[0]))) for impl, rank_traces in runs}
    names = list(dict.fromkeys(name for impl_totals in totals.values() for name in impl_totals))
    body = [[name, *(f"{totals[impl][name] / steps[impl]:.1f}" if name in totals[impl] else "-" for impl, _ in runs)]
            for name in names]
    return markdown_table(["span (rank 0, ms per traced step)", *(impl for impl, _ in runs)], body)


def timeline_section(summaries: list[dict], report_path: Path) -> str:
    """The report's timelines: per cell a picture (written beside the report), the spans' times and
    each impl's communication summary; empty when no run was traced."""
    from zero_lab.analysis.report.timeline_plot import write_timeline  # matplotlib: only for a report

    cells = traced_runs(summaries)
    if not cells:
        return ""
    out = ["## Timelines", "",
           "From each run's `trace/trace-rank<N>.json` (`--trace`; open them in Perfetto or chrome://tracing, "
           "docs/trace.md): one traced step per impl, ranks as rows, compute above collectives, memory below.", ""]
    stem = report_path.with_suffix("")
    for (world_size, stage), runs in sorted(cells.items()):
        title = f"world size {world_size}, stage {stage}"
        picture = write_timeline(runs, stem.with_name(f"{stem.name}-timeline-w{world_size}-s{stage}.png"), title)
        out += [f"### Timeline: {title}", ""]
        if picture is not None:
            out += [f"![timeline, {title}]({picture.name})", ""]
        out += [phase_table(runs), ""]
        for impl, rank_traces in runs:
            out += [f"Communication, {impl} (rank 0, traced steps {rank_traces[0].get('traceSteps')}; "
                    "DeepSpeed's comms-logger columns, nccl-tests' busbw):", "",
                    summary_table(traces.comm_summary(rank_traces[0])), ""]
    return "\n".join(out)
