"""Markdown rendering of a comparison: tables, verdict, failures, config differences."""

from zero_lab.analysis.report.markdown import dict_differences, markdown_table, render_report
from zero_lab.analysis.compare.comparison import build_comparison
from tests.analysis.node_runs import RUN_COLUMNS, nodes_summaries


def summary(impl, status="ok", alloc=100.0, reduce_scatter="True", **extra):
    return {"world_size": 2, "stage": 2, "impl": impl, "status": status, "steps": 2, "loss_last": 4.0,
            "alloc_max_mb": alloc, "peak_alloc_max_mb": alloc, "reserved_max_mb": 800.0,
            "peak_reserved_max_mb": 900.0, "step_ms": 10.0, "comm_mb": 6.0, "precision": "fp32",
            "params": 1_000_000, "losses": {"1": 5.0, "2": 4.0},
            "updates": {"1": {"lr": 1e-3, "applied": True, "moved": True}},
            "zero": {"impl": impl, "stage": 2.0, "reduce_scatter": reduce_scatter},
            "config": {"zero_optimization": {"stage": 2}, "optimizer": {"type": "AdamW"}},
            "env": {"torch": "2.13.0", "device": "cpu"}, **extra}


def test_report_has_cell_table_verdict_estimates_config_differences_and_environment():
    summaries = [summary("nano", alloc=110.0, reduce_scatter="False"), summary("official")]
    comparison = build_comparison(summaries, ["nano", "official"])
    text = render_report(comparison, summaries, "demo", plots=["demo-loss.png"])
    assert text.startswith("# demo\n")
    assert "**Verdict: PASS** - loss parity: yes over 1 update (tolerance 0.0001)" in text
    assert "## world size 2, stage 2: nano vs official" in text
    assert "| alloc MB | 110.0 | 100.0 | +10.0 | +10.00 |" in text
    assert "| loss parity |  |  | yes (1 update) |  |" in text
    # 1M fp32 parameters, stage 2, 2 ranks: 4 + 12/2 = 10 bytes per parameter
    assert "| 2 | 2 | nano | 110.0 | 110.0 | 9.5 | 9.5 |" in text
    assert "| [zero] reduce_scatter | False | True |" in text
    assert "![demo-loss.png](demo-loss.png)" in text
    assert "| torch | 2.13.0 |" in text


def test_failed_run_shows_rank_exit_code_and_log_tail():
    summaries = [summary("nano"), summary("official", status="failed", failed_rank=1, exit_code=1,
                                           run_dir="runs/x", log_tail="Traceback\nRuntimeError: boom", steps=0)]
    text = render_report(build_comparison(summaries, ["nano", "official"]), summaries, "t", plots=[])
    assert "**Verdict: RUN FAILED**" in text
    assert "rank 1, exit code 1, logs in `runs/x`" in text and "RuntimeError: boom" in text


def test_table_and_differences_helpers():
    assert markdown_table(["a", "b"], [["1", "2"]]) == "| a | b |\n|---|---|\n| 1 | 2 |"
    assert dict_differences({"a": {"b": 1, "c": 2}}, {"a": {"b": 1, "c": 3}, "d": 4}) == [
        ("a.c", 2, 3), ("d", None, 4)]


def test_the_runs_table_splits_the_wire_bytes_by_node_only_when_ranks_crossed_a_node():
    """`--ranks-per-node 2` at W=4: the runs table adds the intra- and inter-node medians after the
    wire bytes (every column before stays as it was); one node (inter 0 in every step): no split."""
    split = nodes_summaries([2**20, 2**20, 3 * 2**20, 2**20])  # the steady median drops step 1
    text = render_report(build_comparison(split, ["nano"]), split, "nodes", plots=[])
    runs = text[text.index("## Runs"):]
    assert RUN_COLUMNS + " intra-node wire MB / step | inter-node wire MB / step |" in runs
    assert "| 4 | 3 | nano | PartitionedAdam | ok | 4 | 2.000000 | 5.0 | 30.0 | 100.0 | 4.00 | 3.00 | 2.00 | 1.00 |" in runs
    one_node = nodes_summaries([0, 0, 0])
    text = render_report(build_comparison(one_node, ["nano"]), one_node, "one node", plots=[])
    runs = text[text.index("## Runs"):]
    assert RUN_COLUMNS + "\n" in runs and "intra-node" not in text
