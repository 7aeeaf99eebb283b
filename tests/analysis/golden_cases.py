"""The recorded comparison under tests/fixtures/compare-tiny, and edge cases cut from it, for the
before/after tests of compare.json and the reports (tests/analysis/test_golden.py).

The fixture is a real `zero-lab compare --gpus 2 --device cpu --model tiny --steps 3 --stages 1,2,3`
(cells/*/summary.json and rank 0's log, its compare.json and report.md); tests/fixtures/golden/ holds what
the code before pandas made of the edge cases below.
"""

import copy
import json
import math
from pathlib import Path

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
COMPARE_DIR = FIXTURES / "compare-tiny"
GOLDEN = FIXTURES / "golden"
IMPLS = ["nano", "official"]
TITLE = "zero-lab: nano vs official DeepSpeed"
PLOTS = ["report-loss.png", "report-memory.png", "report-phases.png"]


def recorded_summaries() -> list[dict]:
    return [json.loads(path.read_text()) for path in sorted(COMPARE_DIR.glob("cells/*/summary.json"))]


def by_cell(summaries: list[dict]) -> dict[str, dict]:
    return {f"w{s['world_size']}-s{s['stage']}-{s['impl']}": s for s in summaries}


def edge_summaries() -> list[dict]:
    """The recorded runs, bent where arithmetic has corners: a diverged run (NaN last loss), a
    baseline of 0 MB (no percentage, no ratio), a missing figure, a failed run without steps, a
    cell with one impl, a step only one impl logged."""
    summaries = copy.deepcopy(recorded_summaries())
    cells = by_cell(summaries)
    diverged = cells["w2-s1-nano"]
    diverged["losses"]["3"] = math.nan
    diverged["loss_last"] = math.nan
    zero = cells["w2-s2-official"]
    zero["reserved_max_mb"] = 0.0
    zero["step_ms"] = 0.0
    zero["step_times_ms"] = {step: 0.0 for step in zero["step_times_ms"]}
    zero["comm_wire_mb"] = None
    cells["w2-s2-nano"]["losses"]["4"] = 1.0
    failed = cells["w2-s3-official"]
    failed.update(status="failed", steps=0, loss_last=None, alloc_max_mb=None, peak_alloc_max_mb=None, losses={},
                  step_times_ms={})
    lonely = copy.deepcopy(cells["w2-s1-official"])
    lonely.update(world_size=4, losses={"1": 5.0})
    return summaries + [lonely]


def resumed_runs() -> list[dict]:
    """Resumed runs of stage 2: nano's equal after the checkpoint, official's off at step 3."""
    cells = by_cell(recorded_summaries())
    nano, official = copy.deepcopy(cells["w2-s2-nano"]), copy.deepcopy(cells["w2-s2-official"])
    nano["losses"] = {step: loss for step, loss in nano["losses"].items() if int(step) >= 2}
    official["losses"] = {"2": official["losses"]["2"], "3": official["losses"]["3"] + 1e-3}
    return [nano, official]


# Rank-0 logs whose summaries have corners: a NaN loss last, a figure only some steps carry, a
# single step (its own median), a value that is not a number, no step at all.
EDGE_LOGS = {
    "diverged": "[opt_step 1] loss=5.0 step_ms=900.0 alloc_max_mb=10.0\n"
                "[opt_step 2] loss=nan step_ms=100.0 alloc_max_mb=12.0\n",
    "partial": "[opt_step 1] loss=5.0 step_ms=900.0 comm_mb=1.0\n[opt_step 2] loss=4.0 step_ms=100.0\n"
               "[opt_step 3] loss=3.0 step_ms=120.0 comm_mb=3.0 comm_wire_mb=2\n"
               "[opt_step 4] loss=2.0 step_ms=130.0 comm_mb=5.0 comm_wire_mb=4 states_device_mb=true\n",
    "one step": "[opt_step 1] loss=5.0 step_ms=900.0 alloc_max_mb=10 peak_alloc_max_mb=20.5 tokens_per_s=3\n",
    "seed": "[opt_step 1] loss=2.3 cuda_alloc_max_mb=7340.5 cuda_peak_alloc_max_mb=10260.2\n"
            "[opt_step 2] loss=2.2 cuda_alloc_max_mb=7341.5 cuda_peak_alloc_max_mb=10250.2\n",
    "no steps": "[zero] impl=nano stage=2 world_size=2\n[opt_step 1] loss=x\n",
}
