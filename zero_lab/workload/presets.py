"""The built-in model presets: Qwen3 architectures as plain numbers, importable without torch (the
CLI's estimates and reports read them; `models.build_model` builds them).

Every preset uses the byte tokenizer's 260-token vocabulary except where the real architecture
fixes it:
- `tiny`: about 0.85M parameters, for tests;
- `small`: about 24M parameters, for comparisons on CPU;
- `qwen3-0.6b`: Qwen3-0.6B's real architecture (0.6B parameters, its 151,936-token vocabulary).
"""

from __future__ import annotations

from zero_lab.workload.tokenizer import ByteTokenizer

DEFAULT_SEQ_LEN = 128  # tokens per sample when no --seq-len is given (harness and estimates)
SHARED_SETTINGS = {"rms_norm_eps": 1e-6, "rope_theta": 1_000_000.0, "use_cache": False}
PRESETS = {
    "tiny": dict(vocab_size=ByteTokenizer.vocab_size, hidden_size=128, intermediate_size=384,
                 num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                 max_position_embeddings=2048, tie_word_embeddings=False),
    "small": dict(vocab_size=ByteTokenizer.vocab_size, hidden_size=512, intermediate_size=1376,
                  num_hidden_layers=8, num_attention_heads=8, num_key_value_heads=4, head_dim=64,
                  max_position_embeddings=4096, tie_word_embeddings=False),
    # Qwen3-0.6B's config.json, as published.
    "qwen3-0.6b": dict(vocab_size=151_936, hidden_size=1024, intermediate_size=3072,
                       num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8,
                       head_dim=128, max_position_embeddings=40_960, tie_word_embeddings=True),
}
