"""docs/doctor.md's numbers, each from the code that produces it: the codes and severities, the
thresholds, the flight record's size, explain's arithmetic for Qwen3-0.6B and tiny at stage 3, the
recorded comparison's buffers, the models' sizes. What real runs produce (the mismatch's call and
bytes, the dtype table, the runs that part) is held by tests/diagnosis/, which read this page too."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from tests.docs.doc_text import REPO, read, table_after
from zero_lab.analysis.memory.activation_memory import decoder_shape
from zero_lab.analysis.diagnosis import diagnose, memory, stage3
from zero_lab.analysis.diagnosis.finding import SEVERITY_OF
from zero_lab.analysis.compare.metrics import DEFAULT_LOSS_TOL
from zero_lab.analysis.memory.peak_memory import DEEPSPEED_FETCH_RULES, layers_whole_after_forward, predict_peak, unit_parameters
from zero_lab.workload.meters import collective_record

DOC = read(REPO / "docs" / "doctor.md")
TEXT = " ".join(DOC.split())  # one space between words: a number is found whatever line it ends


def test_the_codes_table_is_the_contract():
    rows = table_after(DOC, "## The codes")[1:]
    assert {row[0].strip("`"): row[1] for row in rows} == SEVERITY_OF


def test_thresholds_and_tolerances():
    assert (memory.GAP_PCT, memory.GAP_FLOOR, memory.BUCKET_SHARE) == (15.0, 64 * 2**20, 1 / 3)
    assert "more than 15% and by 64 MB or more" in TEXT and "a third of the measured peak" in TEXT
    assert (DEFAULT_LOSS_TOL["fp32"], DEFAULT_LOSS_TOL["bf16"], DEFAULT_LOSS_TOL["fp16"]) == (0.0001, 0.05, 0.05)
    assert "0.0001 in fp32, 0.05 in bf16 and fp16" in TEXT


def test_the_flight_record_size():
    assert (collective_record.CAPACITY, collective_record.ENTRY.size) == (4096, 200)
    assert "the last 4096 calls, each a 200-byte entry" in TEXT


def test_stage_3_against_stage_2_for_qwen3_0_6b():
    """Official on 8 ranks in bf16, micro-batch 1 of 512 tokens, DeepSpeed's defaults (reduce bucket
    500,000,000 elements, persistence threshold 100,000)."""
    shape = decoder_shape("qwen3-0.6b")

    def peak(stage, rules=DEEPSPEED_FETCH_RULES):
        return round(predict_peak(shape, stage, "bf16", 8, 512, 1, reduce_bucket_size=500_000_000, impl="official",
                                  fetch_rules=rules, persistence_threshold=100_000).peak / 2**20)

    setting, capped = stage3.releasing_rules(shape, DEEPSPEED_FETCH_RULES)[0]
    assert setting == "stage3_max_live_parameters: 187045376, stage3_max_reuse_distance: 0"
    # the page names the key that caps the live set; the reuse distance is DeepSpeed's default there
    capped_live_only = dataclasses.replace(DEEPSPEED_FETCH_RULES, max_live_parameters=capped.max_live_parameters)
    assert layers_whole_after_forward(shape, DEEPSPEED_FETCH_RULES) == shape.layers == 28
    figures = (peak(2), peak(3), layers_whole_after_forward(shape, capped), peak(3, capped))
    assert figures == (5117, 5224, 2, 4384)
    assert (f"official's peak at {figures[0]} MB at stage 2 and {figures[1]} MB at stage 3, where all 28 of 28 layers"
            in TEXT)
    assert f"`stage3_max_live_parameters: {capped.max_live_parameters}` (the root and two layers), 2 layers stay and " \
           f"the peak is {figures[3]} MB" in TEXT
    assert layers_whole_after_forward(shape, capped_live_only) > 2  # why the doctor sets the reuse distance too


def test_tiny_at_stage_3():
    layer, root = unit_parameters(decoder_shape("tiny"))
    assert (layer, root) == (196928, 66688)
    assert f"4 layers of {layer} elements, a root of {root}" in TEXT
    assert f"`stage3_max_live_parameters: {root + 2 * layer}`, which keeps 2 of 4 layers" in TEXT


def test_the_recorded_comparisons_buffers():
    [finding] = [found for found in diagnose([REPO / "tests" / "fixtures" / "compare-tiny"])
                 if found.code == "buckets-dominate" and Path(found.runs[0]).name == "w2-s2-official"]
    assert finding.evidence[0].endswith("76.3 MB of the measured peak 110.3 MB")
    assert finding.title.endswith("69% of the peak") and "predicted peak 34.8 MB" in finding.fix
    assert "20000000-element staging buffer: 76.3 MB of its measured 110.3 MB peak (69%), against 8.1 MB" in TEXT
    assert "`reduce_bucket_size: 16384`" in TEXT and "the predicted peak is 34.8 MB" in TEXT


def parameters(name: str) -> int:
    shape = decoder_shape(name)
    layer, root = unit_parameters(shape)
    return shape.layers * layer + root


def test_model_sizes():
    small, tiny = parameters("small"), parameters("tiny")
    assert (small, tiny) == (23475712, 854400)
    assert (f"{small} parameters: {small * 4 / 2**20:.1f} MB whole in fp32, {small * 4 / 5 / 2**20:.1f} MB per rank "
            "partitioned over 5 ranks") in TEXT
    assert f"{tiny} parameters, {tiny * 2 / 2**20:.1f} MB of whole weights" in TEXT


def test_hugging_face_trains_without_weight_decay_unless_told():
    from transformers import TrainingArguments

    default = next(field.default for field in dataclasses.fields(TrainingArguments) if field.name == "weight_decay")
    assert default == 0.0 and "`TrainingArguments` defaults `weight_decay` to 0" in TEXT
