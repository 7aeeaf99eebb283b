"""The model and data both examples train (`hf_trainer.py`, `accelerate_loop.py`): a 2-layer Llama
built from a config, and fixed random token ids, both from a seed, so that every impl starts from
the same weights and sees the same batches."""

from __future__ import annotations

import torch
from transformers import LlamaConfig, LlamaForCausalLM

VOCAB_SIZE = 512


def tiny_llama() -> LlamaForCausalLM:
    """A 2-layer Llama, about 0.14M parameters: enough for every ZeRO partition to hold something.
    Its weights come from torch's global generator: seed it first."""
    config = LlamaConfig(vocab_size=VOCAB_SIZE, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                         tie_word_embeddings=False)
    return LlamaForCausalLM(config)


def random_tokens(samples: int, seq_len: int, seed: int) -> torch.Tensor:
    """samples x seq_len token ids, the same for a seed on every machine."""
    return torch.randint(0, VOCAB_SIZE, (samples, seq_len), generator=torch.Generator().manual_seed(seed))
