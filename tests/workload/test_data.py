"""Batches are a function of (micro step, rank); both dataset formats parse; bad files fail clearly."""

import json
import math

import pytest
import torch

from zero_lab.workload.data import IGNORE_INDEX, load_examples, make_batches
from zero_lab.workload.errors import WorkloadError
from zero_lab.workload.models import build_model
from zero_lab.workload.tokenizer import ByteTokenizer

TOKENIZER = ByteTokenizer()


def write(path, text):
    path.write_text(text)
    return path


@pytest.fixture
def lima(tmp_path):
    records = [{"conversations": [{"from": "human", "value": "Hi?"}, {"from": "gpt", "value": "Hello."}]},
               {"conversations": ["2+2?", "4.", "and 3+3?", "6."]}]
    return write(tmp_path / "lima.json", json.dumps(records))


def test_batches_are_a_function_of_step_and_rank(lima):
    for dataset in (None, str(lima)):
        one = make_batches(TOKENIZER, 16, batch_size=2, world_size=2, seed=7, dataset_path=dataset)
        again = make_batches(TOKENIZER, 16, batch_size=2, world_size=2, seed=7, dataset_path=dataset)
        for step, rank in ((0, 0), (0, 1), (5, 1)):
            assert all(torch.equal(one.get(step, rank)[key], again.get(step, rank)[key])
                       for key in ("input_ids", "labels", "attention_mask"))
    builtin = make_batches(TOKENIZER, 16, batch_size=2, world_size=2, seed=7)
    assert not torch.equal(builtin.get(0, 0)["input_ids"], builtin.get(0, 1)["input_ids"])
    assert not torch.equal(builtin.get(0, 0)["input_ids"], builtin.get(1, 0)["input_ids"])


def test_ranks_together_hold_the_single_process_global_batch():
    two_ranks = make_batches(TOKENIZER, 16, batch_size=2, world_size=2, seed=3)
    one_rank = make_batches(TOKENIZER, 16, batch_size=4, world_size=1, seed=3)
    for step in range(3):
        stacked = torch.cat([two_ranks.get(step, 0)["input_ids"], two_ranks.get(step, 1)["input_ids"]])
        assert torch.equal(stacked, one_rank.get(step, 0)["input_ids"])


def test_conversations_mask_everything_but_the_replies(lima):
    first, second = load_examples(lima, TOKENIZER, seq_len=256)
    end = TOKENIZER.eos_token_id

    def targets(example):
        return [token for token, label in zip(example.input_ids, example.labels) if label != IGNORE_INDEX]

    assert targets(first) == list(b"Hello.") + [end]
    assert targets(second) == list(b"4.") + [end] + list(b"6.") + [end]
    assert first.input_ids[: len(b"Hi?") + 1] == [TOKENIZER.special_ids["<|user|>"]] + list(b"Hi?")


def test_jsonl_text_and_truncation_padding(tmp_path):
    path = write(tmp_path / "t.jsonl", '{"text": "abc"}\n\n{"text": "' + "x" * 50 + '"}\n')
    short, long = load_examples(path, TOKENIZER, seq_len=8)
    assert short.input_ids == list(b"abc") + [TOKENIZER.eos_token_id] and short.labels == short.input_ids
    assert len(long.input_ids) == 8
    batch = make_batches(TOKENIZER, 8, 16, 1, seed=0, dataset_path=str(path)).get(0, 0)
    padded = batch["attention_mask"] == 0
    assert padded.any() and (batch["labels"][padded] == IGNORE_INDEX).all()


def test_max_samples_and_min_target_tokens(lima, tmp_path):
    assert len(load_examples(lima, TOKENIZER, 256, max_samples=1)) == 1
    # targets: "Hello.<end>" is 7 tokens, "4.<end>6.<end>" only 6
    assert len(load_examples(lima, TOKENIZER, 256, min_target_tokens=7)) == 1
    with pytest.raises(WorkloadError, match="Lower --min-target-tokens"):
        load_examples(lima, TOKENIZER, 256, min_target_tokens=100)


@pytest.mark.parametrize("text, message", [
    ('{"text": "ok"}\n{"text": \n', "line 2 is not valid JSON"),
    ('[{"text": "ok"}, ', "is not valid JSON"),
    ('{"prompt": "no known field"}\n', "neither 'conversations' nor a 'text'"),
    ('{"conversations": [{"from": "human", "value": "only a question"}]}\n', "no assistant turn"),
    ('{"conversations": ["only a prompt"]}\n', "no assistant turn"),
    ('{"conversations": [{"speaker": "human", "value": "?"}]}\n', "a turn is not"),
    ("\n\n", "holds no records"),
])
def test_malformed_files_are_one_line_errors(tmp_path, text, message):
    with pytest.raises(WorkloadError, match=message) as error:
        load_examples(write(tmp_path / "bad.jsonl", text), TOKENIZER, seq_len=64)
    assert "\n" not in str(error.value)


def test_a_file_that_is_not_utf8_is_a_one_line_error(tmp_path):
    path = tmp_path / "latin1.jsonl"
    path.write_bytes('{"text": "café"}\n'.encode("latin-1"))
    with pytest.raises(WorkloadError, match="is not UTF-8 text .*Save the file as UTF-8"):
        load_examples(path, TOKENIZER, seq_len=64)


def test_tiny_learns_the_builtin_corpus_within_50_steps():
    """Single process, plain torch AdamW: the corpus is learnable, well below ln(vocab)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # one thread per test process: CI shares 2 cores with torchrun tests
    try:
        losses = train_tiny(steps=50)
    finally:
        torch.set_num_threads(threads)
    assert losses[0] > math.log(TOKENIZER.vocab_size) - 0.5  # starts near uniform guessing
    assert sum(losses[-5:]) / 5 < math.log(TOKENIZER.vocab_size) - 2.5


def train_tiny(steps: int) -> list[float]:
    model = build_model("tiny", seed=0)
    batches = make_batches(TOKENIZER, seq_len=32, batch_size=8, world_size=1, seed=0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for step in range(steps):
        loss = model(**batches.get(step, 0)).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses
