"""The activation model against what a forward really leaves alive, counted by the harness's own
storage tracker: Qwen3 presets and a Llama directory, fp32 and bf16, sdpa and eager, with and without
gradient checkpointing; and the loss's temporaries at the turn to the backward."""

from __future__ import annotations

import pytest
import torch

from zero_lab.analysis.memory.activation_memory import activation_bytes, decoder_shape, shape_from_config
from zero_lab.nano.dtypes import DTYPE_NAME_OF_PRECISION
from zero_lab.workload.meters.memory_meter import LiveStorageTracker

SEQ_LEN, MICRO_BATCH = 48, 2


def measured(build, vocab_size: int) -> tuple[int, int, int]:
    """(bytes the forward leaves alive, the batch included; peak beyond them in the backward; the
    gradients' bytes, which this backward allocates as param.grad where an engine keeps its own). The
    model is built inside the tracker, as the harness does, so its weights are known before the
    forward (an op's view of a weight, such as a transpose, is not new memory)."""
    generator = torch.Generator().manual_seed(0)
    with LiveStorageTracker() as tracker:
        model = build().train()
        before = tracker.live_bytes
        ids = torch.randint(0, vocab_size, (MICRO_BATCH, SEQ_LEN), generator=generator)
        batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids.clone()}
        loss = model(**batch).loss
        saved = tracker.live_bytes - before
        tracker.reset_peak()
        turn = tracker.live_bytes
        loss.backward()
        gradients = sum(parameter.grad.untyped_storage().nbytes() for parameter in model.parameters())
        return saved, tracker.peak_bytes - turn, gradients


@pytest.mark.parametrize("precision, attention, checkpointing", [
    ("fp32", "sdpa", False), ("bf16", "sdpa", False), ("fp32", "eager", False), ("bf16", "eager", False),
    ("fp32", "sdpa", True),
])
def test_saved_bytes_of_the_tiny_preset(precision, attention, checkpointing):
    from zero_lab.workload.models import build_model

    shape = decoder_shape("tiny")
    saved, backward_peak, gradients = measured(
        lambda: build_model("tiny", 0, DTYPE_NAME_OF_PRECISION[precision], attention, checkpointing), shape.vocab_size)
    predicted = activation_bytes(shape, SEQ_LEN, MICRO_BATCH, precision, attention, checkpointing)
    assert saved == pytest.approx(predicted.saved, rel=2e-3)
    if not checkpointing:  # the loss's gradients come first; the parameters' gradients then pile up
        assert 0.99 * predicted.loss_transient <= backward_peak <= predicted.loss_transient + gradients


def test_saved_bytes_of_a_llama_directory(tmp_path):
    """Llama has no per-head q/k norms: the model reads model_type from config.json and counts less."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=300, hidden_size=96, intermediate_size=256, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, attn_implementation="sdpa", use_cache=False)
    config.save_pretrained(tmp_path)
    shape = decoder_shape(str(tmp_path))
    assert shape.family == "llama" and shape.head_dim == 24
    saved, _, _ = measured(lambda: LlamaForCausalLM(config), shape.vocab_size)
    predicted = activation_bytes(shape, SEQ_LEN, MICRO_BATCH, "fp32", "sdpa")
    assert saved == pytest.approx(predicted.saved, rel=2e-3)
    as_qwen3 = activation_bytes(shape_from_config({**config.to_dict(), "model_type": "qwen3"}), SEQ_LEN, MICRO_BATCH,
                                "fp32", "sdpa")
    assert as_qwen3.saved > predicted.saved


def test_what_the_model_cannot_describe(tmp_path):
    (tmp_path / "config.json").write_text('{"model_type": "gpt2", "n_embd": 64}')
    assert decoder_shape(str(tmp_path)) is None
    (tmp_path / "config.json").write_text('{"model_type": "llama"}')
    with pytest.raises(ValueError, match="does not describe a decoder"):
        decoder_shape(str(tmp_path))
    with pytest.raises(ValueError, match="attention must be one of"):
        activation_bytes(decoder_shape("tiny"), 8, 1, "fp32", "flash_attention_3")
