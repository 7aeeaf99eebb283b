"""An engine of the user's own as an impl (`--impls nano,official,NAME=PATH`), and its first divergence.

One compare (tiny, 2 processes, stage 1, 4 steps) runs nano, official, `plain` (a third-party
data-parallel engine that implements only DeepSpeed's core calls: tests/fixtures/own_engines/plain_dp.py)
and `wrong` (the same engine with a planted mistake from step 3 on), with `plain` as the baseline.
The references are official DeepSpeed's and nano's losses, which nobody here chose: `plain` must
match them, `wrong` must not, and the report must say where it parts.
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from zero_lab.analysis.compare.divergence import (collective_differences, divergence_lines, first_grad_norm_step,
                                          first_loss_step, parameter_differences)

ZERO_LAB = str(Path(sys.executable).with_name("zero-lab"))
REPO = Path(__file__).resolve().parents[2]
ENGINES = REPO / "tests" / "fixtures" / "own_engines"


@pytest.fixture(scope="module")
def own_compare(tmp_path_factory):
    out = tmp_path_factory.mktemp("runs")
    done = subprocess.run([ZERO_LAB, "compare", "--gpus", "2", "--device", "cpu", "--model", "tiny", "--steps", "4",
                           "--stages", "1", "--impls",
                           f"nano,official,plain={ENGINES / 'plain_dp.py'},wrong={ENGINES / 'wrong_dp.py'}",
                           "--baseline", "plain", "--format", "json", "--out", str(out), "--name", "own"],
                          capture_output=True, text=True, timeout=900)
    return done, out / "own"


@pytest.mark.slow
@pytest.mark.official
def test_a_minimal_third_party_engine_is_measured_like_the_others(own_compare):
    done, _ = own_compare
    assert done.returncode == 1, done.stderr[-3000:]  # the gate: `wrong` parts
    payload = json.loads(done.stdout)
    rows = {row["impl"]: row for row in payload["rows"]}
    assert set(rows) == {"nano", "official", "plain", "wrong"}
    for row in rows.values():
        assert row["status"] == "ok" and row["steps"] == 4
        for key in ("loss_last", "alloc_max_mb", "peak_alloc_max_mb", "step_ms", "comm_wire_mb"):
            assert isinstance(row[key], float) and row[key] > 0, (row["impl"], key)
    assert rows["plain"]["optimizer"] == "torch.optim.AdamW"
    # plain data parallelism all-reduces every gradient: 2 (N-1)/N x P x 4 B = P x 4 B at N=2, as
    # much as nano's reduce-scatter plus all-gather (P = 854,400 parameters of the tiny model)
    assert rows["plain"]["comm_wire_mb"] == rows["nano"]["comm_wire_mb"] == pytest.approx(854_400 * 4 / 2**20, abs=1e-4)
    parity = {(delta["impl"], delta["baseline"]): delta for delta in payload["deltas"]}
    assert parity[("official", "plain")]["loss_parity"] is True
    assert parity[("official", "plain")]["max_step_loss_delta"] == 0.0
    failures = payload["verdict"]["loss_parity_failures"]
    assert failures and all("wrong" in failure for failure in failures), failures


@pytest.mark.slow
@pytest.mark.official
def test_the_wrong_engine_is_caught_with_its_first_divergence(own_compare):
    done, compare_dir = own_compare
    [record] = json.loads(done.stdout)["divergences"]
    assert (record["impl"], record["baseline"], record["step"]) == ("wrong", "plain", 4)
    assert record["gradients_differ"] is None  # plain reports no gradient norm: not compared, not guessed
    # the mistake starts in step 3: fewer all-reduces, fewer bytes, than the baseline's 47 calls of P x 4 B
    assert record["collective_step"] == 3
    [change] = record["collectives"]
    assert change["op"] == "all_reduce" and change["baseline_calls"] == 47
    assert change["baseline_wire_bytes"] == 854_400 * 4 > change["wire_bytes"]
    # ... so rank 0's decoder matrices part after step 3, and only they: the embedding and the norms are still reduced
    assert record["parameter_step"] == 3 and record["parameters_reason"] is None
    assert all(entry["name"].startswith("model.layers.") and entry["name"].endswith("_proj.weight")
               for entry in record["parameters"]) and record["parameters"]
    saved = json.loads((compare_dir / "compare.json").read_text())
    assert saved["divergences"] == [record]
    # what docs/cli.md shows under "First divergence", line for line
    lines = "\n".join(divergence_lines(record))
    shown = next(block for block in (REPO / "docs" / "cli.md").read_text().split("```") if "wrong vs plain" in block)
    assert shown.strip() == lines, (shown, lines)


def test_first_divergence_arithmetic():
    assert first_loss_step({"1": 5.0, "2": 4.0}, {"1": 5.0, "2": 4.01}, 1e-4) == 2
    assert first_loss_step({"1": 5.0, "2": float("nan")}, {"1": 5.0, "2": 4.0}, 1e-4) == 2
    assert first_loss_step({"1": 5.0}, {"1": 5.00001}, 1e-4) is None
    norms = first_grad_norm_step({1: 6.6, 2: 13.2}, {1: 6.6, 2: 6.6}, 2)
    assert norms == {"gradients_differ": True, "grad_norm_step": 2, "grad_norm": 13.2, "baseline_grad_norm": 6.6}
    assert first_grad_norm_step({1: 6.6}, {1: 6.6}, 1) == {"gradients_differ": False}
    assert first_grad_norm_step({1: float("nan")}, {1: 6.6}, 1)["gradients_differ"] is None
    change = collective_differences({1: {"all_reduce": (1, 8)}}, {1: {"reduce_scatter": (2, 8)}}, 1)
    assert change["collective_step"] == 1 and [c["op"] for c in change["collectives"]] == ["all_reduce", "reduce_scatter"]


def test_the_parameters_that_part_first_are_named_from_each_runs_norms(tmp_path):
    """The norms each run's rank 0 wrote after every step (workload/meters/parameter_norms.py): the first step
    whose norms part by more than a relative 1e-6, the parameters that part most there, by name."""
    def run(name: str, lines: list[dict]) -> Path:
        (tmp_path / name / "logs").mkdir(parents=True)
        (tmp_path / name / "logs" / "parameter-norms.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
        return tmp_path / name

    same = {"embed.weight": 3.0, "layer.weight": 2.0, "norm.weight": 1.0}
    baseline = run("baseline", [{"step": 1, "norms": same}, {"step": 2, "norms": same}, {"step": 3, "norms": same}])
    mine = run("mine", [{"step": 1, "norms": {**same, "norm.weight": 1.0 + 1e-8}},
                        {"step": 2, "norms": {**same, "layer.weight": 2.2, "norm.weight": 1.01}},
                        {"step": 3, "norms": same}])
    found = parameter_differences(mine, baseline, 3)
    assert (found["parameter_step"], found["parameters_differing"]) == (2, 2)
    assert [entry["name"] for entry in found["parameters"]] == ["layer.weight", "norm.weight"]  # largest part first
    assert found["parameters"][0] == {"name": "layer.weight", "norm": 2.2, "baseline_norm": 2.0}
    assert parameter_differences(mine, baseline, 1)["parameter_step"] is None  # only up to the loss's step
    stage3 = run("stage3", [{"step": 1, "partitioned": "embed.weight"}])
    assert "embed.weight is not whole on rank 0" in parameter_differences(stage3, baseline, 3)["parameters_reason"]
    assert parameter_differences(tmp_path / "nothing", baseline, 3)["parameters_reason"] == \
        "the run wrote no parameter norms"


@pytest.mark.parametrize("impls, problem", [
    ("nano,mine=does/not/exist.py", "engine does/not/exist.py (impl mine) does not exist"),
    ("nano,official=x.py", "impl name 'official' in 'official=x.py' is a built-in impl's"),
    ("nano,mine", "unknown impl 'mine'"),
])
def test_bad_own_engines_are_one_line_errors(impls, problem, tmp_path):
    done = subprocess.run([ZERO_LAB, "compare", "--device", "cpu", "--impls", impls, "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stderr.startswith(f"error: {problem}"), done.stderr
    assert "Traceback" not in done.stderr
