"""Tokens for the workload: a byte-level tokenizer for the built-in presets (no download, no
vocabulary file), and two helpers that treat it and a Hugging Face tokenizer alike.

The byte tokenizer's vocabulary is the 256 byte values followed by four special tokens. Its chat
template marks each turn with a role token and closes it with `<|end|>`, so, as with any chat
template, the tokens before an assistant's reply are the prompt and can be masked.
"""

from __future__ import annotations

from collections.abc import Mapping

BYTE_VALUES = 256
SPECIAL_TOKENS = ("<|pad|>", "<|user|>", "<|assistant|>", "<|end|>")
ROLE_TOKENS = {"system": "<|user|>", "user": "<|user|>", "assistant": "<|assistant|>"}


class ByteTokenizer:
    """UTF-8 bytes as token ids 0-255; special tokens from 256 on. The same interface as the parts
    of a Hugging Face tokenizer the workload uses (`encode`, `apply_chat_template`, `*_token_id`)."""

    vocab_size = BYTE_VALUES + len(SPECIAL_TOKENS)

    def __init__(self):
        self.special_ids = {token: BYTE_VALUES + i for i, token in enumerate(SPECIAL_TOKENS)}
        self.pad_token_id = self.special_ids["<|pad|>"]
        self.eos_token_id = self.special_ids["<|end|>"]

    def __len__(self) -> int:
        return self.vocab_size

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return list(text.encode("utf-8"))

    def apply_chat_template(self, messages, add_generation_prompt=False, tokenize=True, **_):
        ids: list[int] = []
        for message in messages:
            ids.append(self.special_ids[ROLE_TOKENS[message["role"]]])
            ids.extend(self.encode(message["content"]))
            ids.append(self.eos_token_id)
        if add_generation_prompt:
            ids.append(self.special_ids["<|assistant|>"])
        return ids


def render_chat(tokenizer, messages: list[dict], add_generation_prompt: bool = False) -> list[int]:
    """Token ids of `messages` through the tokenizer's chat template."""
    out = tokenizer.apply_chat_template(
        messages, add_generation_prompt=add_generation_prompt, tokenize=True
    )
    if isinstance(out, Mapping):  # transformers 5 returns a BatchEncoding by default
        out = out["input_ids"]
    return list(out)


def encode_document(tokenizer, text: str) -> list[int]:
    """Token ids of a plain document, closed by the end-of-sequence token when there is one."""
    ids = list(tokenizer.encode(text, add_special_tokens=False))
    if tokenizer.eos_token_id is not None:
        ids.append(tokenizer.eos_token_id)
    return ids


def pad_token_id(tokenizer) -> int:
    """The id used for padding: the pad token, else end of sequence, else 0 (masked either way)."""
    for token_id in (tokenizer.pad_token_id, tokenizer.eos_token_id):
        if token_id is not None:
            return token_id
    return 0
