"""nano's stage-2 peak (`peak_memory.first_reduce_bytes`, `tied_sum_bytes`): when its first bucket fills, the
fp32 gradient partition is allocated beside the bucket, the share's copy (and gloo's received shares) and the
activations of the layers the backward has not reached; with tied embeddings the head's gradient waits for the
embedding's, and the first bucket comes after the loss's temporaries. Held against nano's own runs on this CPU
(2 ranks, 64 tokens a sample: the activations small beside the partition, so these moments decide the peak)
and one measured on a GPU-sized shape: qwen3-0.6b in bf16 on one CPU rank peaked at 11,559.5 MB at its first
reduce, predicted 11,516.8. Before these moments the prediction was 8% to 17% under the CPU runs below."""

from __future__ import annotations

import json

import pytest

from tests.harness_world import Worlds
from zero_lab.analysis.memory.activation_memory import decoder_shape
from zero_lab.analysis.memory.peak_memory import error_percent, predict_peak, predict_run_peak
from zero_lab.analysis.runs.logparse import parse_text
from zero_lab.workload.log_contract.log_lines import MB

# a Qwen3 with tied embeddings and a vocabulary large beside its 2 layers: the head's gradient outweighs a layer's
TIED = {"model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"], "hidden_size": 256, "intermediate_size": 768,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64,
        "vocab_size": 16384, "tie_word_embeddings": True, "max_position_embeddings": 2048, "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0}
CASES = [("small", "float32", "first_reduce"), ("small", "bfloat16", "first_reduce"),
         ("tied", "float32", "first_reduce"), ("tied", "bfloat16", "turn")]


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> Worlds:
    """Every case as `zero-lab run --stage 2 --gpus 2 --seq-len 64` trains it, 2 steps, in one world of 2 ranks."""
    tied = tmp_path_factory.mktemp("tied") / "config.json"
    tied.write_text(json.dumps(TIED))
    models = {"small": "small", "tied": str(tied)}
    runs = {f"{model} {dtype}": ["--impl", "nano", "--zero-stage", "2", "--device", "cpu", "--model-name",
                                 models[model], "--model-dtype", dtype, "--seq-len", "64", "--steps", "2",
                                 "--seed", "42"] for model, dtype, _ in CASES}
    return Worlds(2, {"nano": runs}, tmp_path_factory.mktemp)


@pytest.mark.slow
@pytest.mark.parametrize("model, dtype, moment", CASES)
def test_the_peak_of_the_second_step_is_predicted_within_3_percent_at_its_moment(world, model, dtype, moment):
    parsed = parse_text(world.output(f"{model} {dtype}"))
    precision = "bf16" if dtype == "bfloat16" else "fp32"
    prediction = predict_run_peak(parsed.model, parsed.zero, 2, precision, 2)
    measured = max(row["peak_bytes"] for row in parsed.phases if row["step"] == 2) / MB
    assert prediction.moment == moment, prediction.moments
    assert abs(error_percent(prediction.peak / MB, measured)) < 3, (prediction.peak / MB, measured)


def test_the_moments_on_qwen3_06b():
    """One rank, bf16, one sample of 512 tokens: the first bucket (the last 2e7 elements: layer 27 and part of
    26) fills with 26 layers' activations alive; with 4 layers the tied sum outgrows it."""
    from dataclasses import replace

    shape = decoder_shape("qwen3-0.6b")
    full = predict_peak(shape, 2, "bf16", 1, 512, 1, reduce_bucket_size=20_000_000, device="cpu")
    four = predict_peak(replace(shape, layers=4), 2, "bf16", 1, 512, 1, reduce_bucket_size=20_000_000, device="cpu")
    assert full.moment == "first_reduce" and abs(error_percent(full.peak / MB, 11559.46)) < 1
    assert four.moment == "tied_sum" and abs(error_percent(four.peak / MB, 4679.33)) < 1
