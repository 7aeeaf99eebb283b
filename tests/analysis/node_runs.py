"""Runs whose wire bytes split into nodes (`--ranks-per-node`), as their summaries come from parsed
rank-0 logs: the report's and the console's runs tables read them (test_markdown, tests/cli/test_cli)."""

from zero_lab.analysis.runs.logparse import parse_text
from zero_lab.analysis.runs.tables import summarize_run

# The runs table's columns without a node split (the report's and the console's).
RUN_COLUMNS = ("| world size | stage | impl | optimizer | status | steps | last loss | alloc MB | peak alloc MB "
               "| step ms | comm MB / step | wire MB / step |")


def nodes_log(inter_bytes: list[int]) -> str:
    """Rank 0's log of a nano run at W=4 whose wire bytes split into its node and the other one
    (`--ranks-per-node 2`; with one node every byte is intra-node, inter 0), a step per figure."""
    lines = ["[zero] impl=nano stage=3 world_size=4"]
    for step, inter in enumerate(inter_bytes, 1):
        intra = 2 * inter if inter else 3 * 2**20
        wire = intra + inter
        lines.append(f"[opt_step {step}] loss={6.0 - step} alloc_max_mb=5.0 peak_alloc_max_mb=30.0 step_ms=100.0 "
                     f"comm_mb={wire / 2**20 * 4 / 3:.4f} comm_wire_mb={wire / 2**20:.4f} comm_wire_intra_mb="
                     f"{intra / 2**20:.4f} comm_wire_inter_mb={inter / 2**20:.4f} comm_wire_intra_bytes={intra} "
                     f"comm_wire_inter_bytes={inter}")
    return "\n".join(lines) + "\n"


def nodes_summaries(inter_bytes: list[int]) -> list[dict]:
    """summary.json of that run, as `rundir.summarize` makes it from the parsed log."""
    parsed = parse_text(nodes_log(inter_bytes))
    return [{"world_size": 4, "stage": 3, "impl": "nano", "status": "ok", **summarize_run(parsed),
             "optimizer": "PartitionedAdam", "precision": "fp32",
             "losses": {str(step): loss for step, loss in parsed.losses().items()}}]

