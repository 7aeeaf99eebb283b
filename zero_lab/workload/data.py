"""Training data: a built-in corpus that needs no download, or a dataset file; and batches that are
a deterministic function of (micro step, rank), so both impls and every rerun see the same tokens.

Sources:
- built-in: sentences generated from small word lists by a fixed random generator; a model
  learns their grammar quickly (on `tiny`, loss falls well below ln(vocab) within 50 steps).
- `--dataset-path` FILE: a JSON array or JSON lines of records, each either LIMA/ShareGPT-style
  `{"conversations": [{"from": "human", "value": ...}, {"from": "gpt", "value": ...}]}` (or a
  list of strings alternating user and assistant) or `{"text": ...}`. In conversations only the
  assistant's tokens are targets: the prompt is masked with -100, found through the chat template.

Batches: row b of rank r at micro step m is global row ((m * world_size + r) * batch_size + b);
a random generator seeded with (seed, global row) picks its window or example. Concatenating the
ranks' batches of one micro step gives the single-process global batch.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from zero_lab.workload.errors import WorkloadError
from zero_lab.workload.tokenizer import encode_document, pad_token_id, render_chat

IGNORE_INDEX = -100  # the label Hugging Face's loss skips
ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant",
         "model": "assistant", "system": "system"}

_SUBJECTS = ["the cat", "the dog", "a bird", "my friend", "the teacher", "a farmer", "the child"]
_VERBS = ["sees", "likes", "finds", "paints", "carries", "follows", "feeds"]
_OBJECTS = ["the red ball", "a small box", "the old tree", "a green apple", "the blue boat"]
_PLACES = ["in the garden", "near the river", "at the market", "on the hill", "by the school"]


def builtin_corpus(sentences: int = 6000) -> str:
    """The default training text: simple sentences, the same on every machine."""
    rng = random.Random(1234)
    lines = [f"{rng.choice(_SUBJECTS)} {rng.choice(_VERBS)} {rng.choice(_OBJECTS)} "
             f"{rng.choice(_PLACES)}." for _ in range(sentences)]
    return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class Example:
    """One tokenized sample, already truncated to the sequence length."""

    input_ids: list[int]
    labels: list[int]

    def target_tokens(self) -> int:
        """Labels the loss uses: the first position is never a target (labels shift by one)."""
        return sum(label != IGNORE_INDEX for label in self.labels[1:])


def conversation_example(tokenizer, messages: list[dict]) -> Example:
    """Tokens of a conversation; each assistant turn is a target, everything else is masked.

    A turn's tokens are the difference between the template rendered up to and including it and
    the template rendered up to its generation prompt. A template that renders earlier turns
    differently once later ones follow (Qwen3's drops reasoning) leaves those turns masked.
    """
    last_reply = max(i for i, message in enumerate(messages) if message["role"] == "assistant")
    messages = messages[: last_reply + 1]
    input_ids = render_chat(tokenizer, messages)
    labels = [IGNORE_INDEX] * len(input_ids)
    for i, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        start = len(render_chat(tokenizer, messages[:i], add_generation_prompt=True))
        through_reply = render_chat(tokenizer, messages[: i + 1])
        if input_ids[: len(through_reply)] == through_reply:
            labels[start : len(through_reply)] = input_ids[start : len(through_reply)]
    return Example(input_ids, labels)


def _messages(record, where: str) -> list[dict]:
    turns = record["conversations"]
    if not isinstance(turns, list) or not turns:
        raise WorkloadError(f"{where}: 'conversations' is not a non-empty list",
                            "Give a list of {\"from\": ..., \"value\": ...} turns")
    if all(isinstance(turn, str) for turn in turns):  # original LIMA: user and assistant alternate
        messages = [{"role": ("user", "assistant")[i % 2], "content": turn}
                    for i, turn in enumerate(turns)]
    else:
        messages = [_message(turn, where) for turn in turns]
    # Checked for both forms: a lone string is a prompt with no reply, as much as a lone human turn.
    if not any(message["role"] == "assistant" for message in messages):
        raise WorkloadError(f"{where}: the conversation has no assistant turn",
                            "Add a reply (a turn from 'gpt' or 'assistant', or a second string), "
                            "or drop the record")
    return messages


def _message(turn, where: str) -> dict:
    if not (isinstance(turn, dict) and isinstance(turn.get("value"), str)
            and turn.get("from") in ROLES):
        raise WorkloadError(f"{where}: a turn is not {{\"from\": one of {sorted(ROLES)}, "
                            f"\"value\": text}}: {str(turn)[:80]}", "Fix or drop that record")
    return {"role": ROLES[turn["from"]], "content": turn["value"]}


def read_records(path: Path) -> list[tuple[str, dict]]:
    """(location, record) pairs from a JSON array or a JSON-lines file."""
    if path.is_dir():
        raise WorkloadError(f"dataset {path} is a directory", "Give --dataset-path a JSON or JSONL file")
    if not path.is_file():
        raise WorkloadError(f"dataset {path} does not exist", "Check --dataset-path")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as error:
        raise WorkloadError(f"{path} is not UTF-8 text (byte {error.object[error.start]:#04x} at "
                            f"offset {error.start})", "Save the file as UTF-8") from None
    if text.lstrip().startswith("["):
        try:
            records = json.loads(text)
        except json.JSONDecodeError as error:
            raise WorkloadError(f"{path} is not valid JSON ({error})", "Fix the file") from None
        located = [(f"{path} record {i}", record) for i, record in enumerate(records)]
    else:
        located = []
        for number, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                located.append((f"{path} line {number}", json.loads(line)))
            except json.JSONDecodeError as error:
                raise WorkloadError(f"{path} line {number} is not valid JSON ({error.msg})",
                                    "Give a JSON array or one JSON object per line") from None
    if not located:
        raise WorkloadError(f"{path} holds no records", "Give at least one record")
    return located


def load_examples(path: Path, tokenizer, seq_len: int, max_samples: int | None = None,
                  min_target_tokens: int = 1) -> list[Example]:
    """Tokenized examples of a dataset file, truncated to seq_len, with enough target tokens."""
    examples = []
    for where, record in read_records(path):
        if isinstance(record, dict) and "conversations" in record:
            example = conversation_example(tokenizer, _messages(record, where))
        elif isinstance(record, dict) and isinstance(record.get("text"), str):
            ids = encode_document(tokenizer, record["text"])
            example = Example(ids, list(ids))
        else:
            raise WorkloadError(f"{where} has neither 'conversations' nor a 'text' string",
                                "Give LIMA-style conversations or {\"text\": ...} records")
        example = Example(example.input_ids[:seq_len], example.labels[:seq_len])
        if example.target_tokens() >= min_target_tokens:
            examples.append(example)
        if max_samples is not None and len(examples) >= max_samples:
            break
    if not examples:
        raise WorkloadError(f"no record of {path} has {min_target_tokens} target tokens within "
                            f"{seq_len} tokens", "Lower --min-target-tokens or raise --seq-len")
    return examples


Row = tuple[list[int], list[int], list[int]]  # input_ids, labels, attention_mask


def stream_rows(tokens: list[int], seq_len: int) -> Callable[[random.Random], Row]:
    """Rows that are windows of one token stream at a random offset; every token is a target."""
    if len(tokens) <= seq_len:
        raise WorkloadError(f"the corpus has {len(tokens)} tokens, not more than --seq-len "
                            f"{seq_len}", "Lower --seq-len")

    def row(rng: random.Random) -> Row:
        start = rng.randrange(len(tokens) - seq_len)
        window = tokens[start : start + seq_len]
        return window, list(window), [1] * seq_len

    return row


def example_rows(examples: list[Example], seq_len: int, pad_id: int) -> Callable[[random.Random], Row]:
    """Rows that are one random example each, padded to seq_len (padding masked and unattended)."""

    def row(rng: random.Random) -> Row:
        example = examples[rng.randrange(len(examples))]
        padding = seq_len - len(example.input_ids)
        return (example.input_ids + [pad_id] * padding, example.labels + [IGNORE_INDEX] * padding,
                [1] * len(example.input_ids) + [0] * padding)

    return row


class Batches:
    """The micro batch of (micro_step, rank): `batch_size` rows, each a function of its global row."""

    def __init__(self, rows: Callable[[random.Random], Row], batch_size: int, world_size: int,
                 seed: int):
        self.rows = rows
        self.batch_size = batch_size
        self.world_size = world_size
        self.seed = seed

    def get(self, micro_step: int, rank: int, device: torch.device | str = "cpu") -> dict:
        first_row = (micro_step * self.world_size + rank) * self.batch_size
        rows = [self.rows(random.Random(self.seed * 1_000_003 + first_row + b))
                for b in range(self.batch_size)]
        input_ids, labels, attention_mask = (torch.tensor(column, device=device)
                                             for column in zip(*rows))
        return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}


def make_batches(tokenizer, seq_len: int, batch_size: int, world_size: int, seed: int,
                 dataset_path: str | None = None, max_samples: int | None = None,
                 min_target_tokens: int = 1) -> Batches:
    """Batches from the built-in corpus, or from the dataset file when a path is given."""
    if dataset_path is None:
        rows = stream_rows(tokenizer.encode(builtin_corpus(), add_special_tokens=False), seq_len)
    else:
        examples = load_examples(Path(dataset_path), tokenizer, seq_len, max_samples,
                                 min_target_tokens)
        rows = example_rows(examples, seq_len, pad_token_id(tokenizer))
    return Batches(rows, batch_size, world_size, seed)
