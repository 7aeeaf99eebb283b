"""The FLOPs per token behind MFU, held against torch's own FLOP counter over a real forward and
backward (eager attention, so every matmul is one the counter sees)."""

from __future__ import annotations

import math

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode
from transformers import Qwen3Config, Qwen3ForCausalLM

from zero_lab.workload.meters.model_flops import attention_shape, device_name, flops_per_token, matmul_weights
from zero_lab.workload.model_shapes import PRESETS, SHARED


def tiny_qwen3(tied: bool) -> Qwen3ForCausalLM:
    torch.manual_seed(0)
    config = Qwen3Config(**{**PRESETS["tiny"], "tie_word_embeddings": tied}, **SHARED, attn_implementation="eager")
    return Qwen3ForCausalLM(config)


@pytest.mark.parametrize("tied", [False, True], ids=["own-head", "tied-head"])
def test_flops_per_token_equals_torchs_count_of_a_training_step(tied):
    """torch counts matmul FLOPs only; the formula also gives each norm weight 6 FLOPs, as torchtitan's
    6 x (parameters - embedding) does. A tied head must be counted: its matmul runs."""
    model = tiny_qwen3(tied)
    assert (model.lm_head.weight is model.model.embed_tokens.weight) == tied
    batch, seq_len = 2, 48
    tokens = torch.randint(0, 200, (batch, seq_len))
    with FlopCounterMode(display=False) as counter:
        model(input_ids=tokens, labels=tokens).loss.backward()
    norm_weights = sum(parameter.numel() for parameter in model.parameters() if parameter.dim() == 1)
    assert flops_per_token(model, seq_len) == counter.get_total_flops() / (batch * seq_len) + 6 * norm_weights


def test_the_attention_term_grows_with_the_sequence():
    model = tiny_qwen3(False)
    layers, heads, head_dim = attention_shape(model.config)
    assert (layers, heads, head_dim) == (4, 4, 32)
    assert flops_per_token(model, 256) - flops_per_token(model, 128) == 12 * layers * heads * head_dim * 128


def test_matmul_weights_leave_out_the_input_embedding_alone():
    own, tied = tiny_qwen3(False), tiny_qwen3(True)
    embedding = own.model.embed_tokens.weight.numel()
    assert matmul_weights(own) == sum(parameter.numel() for parameter in own.parameters()) - embedding
    assert matmul_weights(tied) == matmul_weights(own)  # the head's matmul is the same work, shared or not


def test_a_model_without_an_attention_shape_has_no_count():
    assert math.isnan(flops_per_token(torch.nn.Linear(4, 4), 16))


def test_the_device_name_has_no_spaces():
    name = device_name(torch.device("cpu"))
    assert name and " " not in name
