"""`zero-lab doctor` on real runs: each finding produced by the training that causes it, and none of
severity warning or error on healthy runs of every stage, precision and impl.

The runs train in spawned worlds (tests/diagnosis/run_directories.py), laid out as `zero-lab run`
lays them out: one world of 2 ranks for nano's and FSDP2's runs, one for official's stage-3 run,
and one of 5 ranks where building the whole model on every rank sets the run's peak. tiny, 2 steps,
micro-batch 2 of 16 tokens (the wide world: small, 1 of 8).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.diagnosis.run_directories import HarnessRun, harness_config, run_directories
from tests.docs.doc_text import table_after
from zero_lab.analysis.memory.activation_memory import decoder_shape
from zero_lab.analysis.diagnosis import diagnose
from zero_lab.analysis.diagnosis.finding import ERROR, INFO, WARNING
from zero_lab.analysis.memory.peak_memory import unit_parameters

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
WORKLOAD = ["--model-name", "tiny", "--steps", "2", "--batch-size", "2", "--seq-len", "16", "--seed", "0"]
LAYER, ROOT = unit_parameters(decoder_shape("tiny"))
CAPPED = ROOT + 2 * LAYER  # the doctor's first suggestion for tiny: the root and two layers live at most


def nano_runs(save_dir: Path) -> dict[str, HarnessRun]:
    return {
        "stage0": HarnessRun("nano", 0),
        "stage1_fp16": HarnessRun("nano", 1, "float16"),
        "stage2": HarnessRun("nano", 2),
        "stage2_bf16": HarnessRun("nano", 2, "bfloat16"),
        "fsdp2_stage2_bf16": HarnessRun("fsdp2", 2, "bfloat16"),
        "fsdp2_stage3": HarnessRun("fsdp2", 3),
        "stage3": HarnessRun("nano", 3),
        "stage3_capped": HarnessRun("nano", 3, config=harness_config(3, stage3_max_live_parameters=CAPPED)),
        "saved": HarnessRun("nano", 3, "bfloat16", arguments=["--save-dir", str(save_dir)]),
        "constant": HarnessRun("nano", 2, config=optimizer_config(0.0)),
        "decayed": HarnessRun("nano", 2, config=optimizer_config(1.0)),
        "reseeded": HarnessRun("nano", 2, config=optimizer_config(0.0), arguments=["--seed", "1"]),
        "persistent": HarnessRun("nano", 3, config=harness_config(3, stage3_param_persistence_threshold=10**9),
                                 arguments=["--model-name", "small", "--batch-size", "1", "--seq-len", "8"]),
    }


def optimizer_config(weight_decay: float) -> dict:
    """Stage 2 at a constant learning rate of 1e-2 (the harness's warm-up starts at 0: its first step
    moves nothing), AdamW with this weight decay."""
    config = harness_config(2)
    config.pop("scheduler")
    config["optimizer"]["params"].update(lr=1e-2, weight_decay=weight_decay)
    return config


HEALTHY = ("stage0", "stage1_fp16", "stage2", "stage2_bf16", "fsdp2_stage2_bf16", "fsdp2_stage3", "stage3",
           "stage3_capped")


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    directory = tmp_path_factory.mktemp("runs")
    found = run_directories(2, nano_runs(directory / "checkpoints"), directory / "nano", WORKLOAD)
    found |= run_directories(2, {"official_stage3": HarnessRun("official", 3)}, directory / "official", WORKLOAD)
    return found


@pytest.fixture(scope="module")
def wide(tmp_path_factory) -> Path:
    """small on 5 ranks, nothing prefetched: the partitioned training holds less than one whole model."""
    directory = tmp_path_factory.mktemp("wide")
    workload = ["--model-name", "small", "--steps", "2", "--batch-size", "1", "--seq-len", "8"]
    config = harness_config(3, stage3_prefetch_bucket_size=0)
    return run_directories(5, {"unprefetched": HarnessRun("nano", 3, config=config)}, directory, workload)["unprefetched"]


def found(paths: list[Path], code: str) -> list:
    return [finding for finding in diagnose(paths) if finding.code == code]


def summary(run: Path) -> dict:
    return json.loads((run / "summary.json").read_text())


def test_healthy_runs_of_every_stage_precision_and_impl_have_no_warning_or_error(runs):
    """nano stages 0-3 (fp32, bf16, fp16), FSDP2 stages 2-3 (fp32, bf16), official stage 3 here, and
    the recorded comparison of nano and official at stages 1-3 (tests/fixtures/compare-tiny), read
    together: facts, but nothing wrong."""
    paths = [runs[name] for name in HEALTHY] + [runs["official_stage3"], REPO / "tests" / "fixtures" / "compare-tiny"]
    findings = diagnose(paths)
    assert [(finding.code, finding.title) for finding in findings if finding.severity != INFO] == []
    assert {finding.code for finding in findings} <= {"stage3-everything-gathered", "buckets-dominate",
                                                       "dtype-difference"}


def test_stage_3_under_the_live_parameter_limit_keeps_every_layer_gathered(runs):
    """nano and official at stage 3 with DeepSpeed's stage3_* defaults: all 4 of tiny's layers stay
    gathered after the forward (nano measures it); the suggested stage3_max_live_parameters keeps 2,
    and a run with it peaks where the doctor predicted."""
    for name in ("stage3", "official_stage3"):
        [finding] = found([runs[name]], "stage3-everything-gathered")
        assert finding.severity == INFO and (finding.figures["layers_gathered"], finding.figures["layers"]) == (4, 4)
        assert finding.figures["options"][0]["setting"] == f"stage3_max_live_parameters: {CAPPED}"
        assert finding.figures["options"][0]["layers_gathered"] == 2
    [nano] = found([runs["stage3"]], "stage3-everything-gathered")
    measured = [line for line in nano.evidence if line.startswith("measured at the end of the forward")]
    assert measured, nano.evidence  # nano's own count of what it holds gathered
    gathered = [row for row in summary(runs["stage3"])["phases"] if row["phase"] == "after_forward"][0]
    # nano's units are each module's parameters, padded one by one: the 4 layers' bytes within 1%
    assert gathered["gathered_parameters_bytes"] == pytest.approx(nano.figures["gathered_bytes"], rel=0.01)
    capped = summary(runs["stage3_capped"])
    predicted = nano.figures["options"][0]["predicted_peak_bytes"] / 2**20
    assert abs(predicted - capped["peak_alloc_max_mb"]) <= 0.15 * capped["peak_alloc_max_mb"], (predicted, capped)
    assert found([runs["stage3_capped"]], "stage3-everything-gathered") == []


def test_a_bf16_stage_3_save_without_the_16bit_gather_is_a_warning(runs):
    [finding] = found([runs["saved"]], "no-16bit-weights-on-save")
    assert finding.severity == WARNING and finding.figures["saves"] == 1
    assert finding.figures["whole_model_bytes"] == summary(runs["saved"])["params"] * 2  # bf16
    assert finding.figures["checkpoint_bytes"] > 0


def test_weight_decay_parts_the_losses_after_agreeing_gradients(runs):
    """The same model, data and gradients; AdamW's weight decay 1 against 0: step 1's losses and
    gradient norms agree, step 2's losses part: the update differed."""
    [finding] = found([runs["constant"], runs["decayed"]], "loss-divergence")
    assert finding.severity == ERROR and finding.figures["step"] == 2
    assert finding.figures["gradients_parted_at"] is None and finding.figures["learning_rate_parted_at"] is None
    assert "the update did not" in finding.cause and "optimizer.params.weight_decay 1.0 against 0.0" in finding.cause


def test_other_weights_and_data_part_the_losses_at_step_1(runs):
    [finding] = found([runs["constant"], runs["reseeded"]], "loss-divergence")
    assert finding.figures["step"] == 1 and "the forward already differed" in finding.cause


def test_fsdp2_and_deepspeed_hold_bf16_parameters_in_different_dtypes(runs):
    [finding] = found([runs["stage2_bf16"], runs["fsdp2_stage2_bf16"]], "dtype-difference")
    assert finding.severity == INFO
    assert finding.table[0] == ["category", "nano", "fsdp2"]
    rows = {row[0]: row[1:] for row in finding.table[1:]}
    assert rows["parameters, stored"] == ["bfloat16", "float32"]
    assert rows["parameters, in the forward"] == ["bfloat16", "bfloat16"]
    assert rows["gradients, reduced in"] == ["bfloat16", "bfloat16"]
    assert found([runs["stage2_bf16"], runs["fsdp2_stage2_bf16"]], "loss-divergence") == []
    assert finding.table == table_after((REPO / "docs" / "doctor.md").read_text(), "FSDP2 and nano on `tiny` in bf16")


def test_a_peak_the_prediction_misses_is_a_gap_with_the_categories_that_differ(runs):
    """small with stage3_param_persistence_threshold above every parameter: nothing is partitioned
    between uses (nano keeps every buffer whole), which the prediction does not model."""
    [finding] = found([runs["persistent"]], "estimate-gap")
    assert finding.severity == WARNING and abs(finding.figures["error_pct"]) > 15
    assert finding.figures["error_pct"] == summary(runs["persistent"])["peak_error_pct"]
    whole = [row for row in finding.figures["categories"] if row["category"] == "parameters"]
    assert whole and all(row["measured"] > row["predicted"] for row in whole)
    assert found([runs["persistent"]], "stage3-everything-gathered") == []  # nothing is sharded: nothing gathered


def test_official_allocates_buckets_larger_than_the_model(runs):
    [finding] = found([runs["official_stage3"]], "buckets-dominate")
    measured = summary(runs["official_stage3"])["peak_alloc_max_mb"]
    assert finding.figures["buffer_bytes"] >= measured * 2**20 / 3
    assert finding.figures["predicted_peak_bytes_with_it"] < measured * 2**20
    assert found([runs["stage3"]], "buckets-dominate") == []  # nano allocates a bucket only as gradients arrive


def test_building_the_whole_model_on_every_rank_can_set_the_peak(wide):
    [finding] = found([wide], "materialized-before-partition")
    figures = finding.figures
    assert finding.severity == WARNING
    assert figures["startup_peak_bytes"] >= figures["whole_model_bytes"]
    assert figures["startup_peak_bytes"] > figures["steady_peak_bytes"]
    assert figures["partition_bytes"] == figures["whole_model_bytes"] / 5
