"""Every figure of docs/throughput.md, computed again: the presets' FLOPs per token (models built on
the meta device, no memory), the worked 512-token step, the peak table and the overhead threshold."""

from __future__ import annotations

import re

import pytest
import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from tests.docs.doc_text import REPO, read, table_after
from zero_lab.analysis.runs.speed.throughput import OVERHEAD_MFU_PCT, PEAK_TFLOPS
from zero_lab.workload.meters.model_flops import flops_per_token, matmul_weights
from zero_lab.workload.model_shapes import PRESETS, SHARED

DOC = read(REPO / "docs" / "throughput.md")


def meta_model(preset: str) -> Qwen3ForCausalLM:
    with torch.device("meta"):
        return Qwen3ForCausalLM(Qwen3Config(**PRESETS[preset], **SHARED))


def figure(text: str) -> float:
    return float(text.replace(",", ""))


@pytest.mark.parametrize("row", table_after(DOC, "For the presets")[1:], ids=lambda row: row[0])
def test_the_presets_flops_per_token_are_the_formulas(row):
    model = meta_model(row[0])
    assert figure(row[1]) == matmul_weights(model)
    assert [figure(cell) for cell in row[2:]] == [flops_per_token(model, seq_len) for seq_len in (128, 512, 2048)]
    assert len(table_after(DOC, "For the presets")) - 1 == len(PRESETS)


def test_the_worked_step_of_512_tokens():
    step_tflop = 512 * flops_per_token(meta_model("qwen3-0.6b"), 512) / 1e12
    h200 = PEAK_TFLOPS["H200"]["bfloat16"]
    assert f"512 tokens of qwen3-0.6b is {step_tflop:.2f} TFLOP" in DOC
    assert f"an H200's {h200:g} dense bf16 TFLOP/s,\n{1000 * step_tflop / h200:.2f} ms" in DOC


def test_the_peak_table_is_the_code_table():
    rows = table_after(DOC, "The first name the")[1:]
    assert [row[0] for row in rows] == list(PEAK_TFLOPS)
    for name, half, single in rows:
        peaks = PEAK_TFLOPS[name]
        assert (figure(half), figure(single)) == (peaks["bfloat16"], peaks["float32"])
        assert peaks["float16"] == peaks["bfloat16"]


def test_the_overhead_threshold():
    assert re.search(rf"Below {OVERHEAD_MFU_PCT:g}% MFU", DOC)
