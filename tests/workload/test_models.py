"""Presets give the same weights for a seed; a local Hugging Face directory loads from disk only,
and its tokenizer's chat template masks the prompt."""

import json

import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from zero_lab.workload.data import IGNORE_INDEX, conversation_example
from zero_lab.workload.errors import WorkloadError
from zero_lab.workload.model_shapes import PRESETS, model_source, preset_blocks, preset_parameters
from zero_lab.nano.policies.stage3_units import fetch_modules, parameter_entries
from zero_lab.workload.models import build_model, check_model_name, load_tokenizer, meta_model, parameter_groups
from zero_lab.workload.tokenizer import ByteTokenizer

WORDS = ["[UNK]", "<|pad|>", "<|end|>", "<|user|>", "<|assistant|>", "hi", "there", "hello", "friend"]
TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|> {{ m['content'] }} <|end|> {% endfor %}"
            "{% if add_generation_prompt %}<|assistant|> {% endif %}")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """The tiny preset saved as a Hugging Face directory, with a word-level tokenizer."""
    path = tmp_path_factory.mktemp("hf-tiny")
    build_model("tiny", seed=5).save_pretrained(path)
    words = Tokenizer(models.WordLevel({word: i for i, word in enumerate(WORDS)}, unk_token="[UNK]"))
    words.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=words, pad_token="<|pad|>", eos_token="<|end|>",
                                        additional_special_tokens=["<|user|>", "<|assistant|>"])
    tokenizer.chat_template = TEMPLATE
    tokenizer.save_pretrained(path)
    return path


def test_a_preset_is_the_same_for_a_seed_and_differs_across_seeds():
    first, again, other = (build_model("tiny", seed) for seed in (1, 1, 2))
    assert all(torch.equal(a, b) for a, b in zip(first.parameters(), again.parameters()))
    assert not torch.equal(next(first.parameters()), next(other.parameters()))


def test_a_local_directory_loads_its_weights_and_tokenizer(model_dir):
    loaded = build_model(str(model_dir), seed=0, dtype="bfloat16")
    saved = build_model("tiny", seed=5)
    assert next(loaded.parameters()).dtype == torch.bfloat16
    assert all(torch.equal(a.to(torch.bfloat16), b) for a, b in zip(saved.parameters(), loaded.parameters()))
    tokenizer = load_tokenizer(str(model_dir))
    messages = [{"role": "user", "content": "hi there"}, {"role": "assistant", "content": "hello friend"}]
    example = conversation_example(tokenizer, messages)
    targets = [token for token, label in zip(example.input_ids, example.labels) if label != IGNORE_INDEX]
    assert tokenizer.decode(targets) == "hello friend <|end|>"


def narrow_config(directory, **changes):
    """A deep-and-narrow Qwen3 config.json written alone (no weights, no tokenizer): its path."""
    config = build_model("tiny", seed=0).config.to_dict()
    config.pop("layer_types", None)  # the tiny preset's, one per layer: Hugging Face derives it again
    config.update(num_hidden_layers=6, hidden_size=64, intermediate_size=96, num_attention_heads=2,
                  num_key_value_heads=1, head_dim=32, **changes)
    path = directory / "config.json"
    path.write_text(json.dumps(config))
    return path


def test_a_config_json_alone_builds_its_shape_with_random_weights_and_the_byte_tokenizer(tmp_path, model_dir):
    path = narrow_config(tmp_path)
    assert model_source(str(path)) == model_source(str(tmp_path)) == "config"  # the file, or its directory
    assert model_source(str(model_dir)) == "pretrained" and model_source("tiny") == "preset"
    first, again, other = (build_model(str(path), seed) for seed in (3, 3, 4))
    assert type(first).__name__ == "Qwen3ForCausalLM" and len(first.model.layers) == 6
    assert first.model.embed_tokens.weight.shape == (ByteTokenizer.vocab_size, 64)
    assert all(torch.equal(a, b) for a, b in zip(first.parameters(), again.parameters()))
    assert not torch.equal(first.lm_head.weight, other.lm_head.weight)
    assert isinstance(load_tokenizer(str(path)), ByteTokenizer)
    on_meta = meta_model(str(tmp_path))
    assert sum(p.numel() for p in on_meta.parameters()) == sum(p.numel() for p in first.parameters())


def test_a_config_alone_refuses_a_vocabulary_the_byte_tokenizer_does_not_fit(tmp_path):
    path = narrow_config(tmp_path, vocab_size=100)
    with pytest.raises(WorkloadError, match=f"vocab_size 100.*needs {ByteTokenizer.vocab_size} token ids"):
        build_model(str(path), seed=0)


def test_a_config_hugging_face_refuses_is_one_line_naming_its_reason(tmp_path):
    path = narrow_config(tmp_path, layer_types=["full_attention"])
    with pytest.raises(WorkloadError, match=r"cannot read the model config .*: .*`num_hidden_layers` \(6\)") as error:
        build_model(str(path), seed=0)
    assert "\n" not in str(error.value)


def test_bad_model_names(tmp_path):
    with pytest.raises(WorkloadError, match="neither a preset"):
        check_model_name("huge")
    with pytest.raises(WorkloadError, match="no config.json"):
        check_model_name(str(tmp_path))


def test_norms_and_biases_get_no_weight_decay():
    decay, no_decay = parameter_groups(build_model("tiny", seed=0), weight_decay=0.1)
    assert all(p.ndim >= 2 for p in decay["params"]) and all(p.ndim == 1 for p in no_decay["params"])
    assert (decay["weight_decay"], no_decay["weight_decay"]) == (0.1, 0.0) and no_decay["params"]


@pytest.mark.parametrize("name", list(PRESETS))
def test_the_pure_parameter_table_is_the_built_presets(name):
    """`zero-lab explain` reads the table without building anything; it must be the real model's
    parameters, in order, each fetched by the modules the engine fetches it with (`stage3_units.fetch_modules`)."""
    with torch.device("meta"):
        model = build_model(name, seed=0)
    table = preset_parameters(name)
    assert [(entry.name, entry.shape) for entry in table] == \
        [(parameter_name, tuple(parameter.shape)) for parameter_name, parameter in model.named_parameters()]
    blocks = fetch_modules(model)  # what the engine fetches as one: each module's own parameters
    assert [entry.blocks for entry in table] == [entry.blocks for entry, _ in parameter_entries(model, blocks)]
    assert preset_blocks(name) == [block_name for block_name, _, _ in blocks]


def test_docs_state_the_byte_tokenizers_vocabulary():
    from tests.docs.doc_text import REPO, read

    text = " ".join(read(REPO / "docs" / "cli.md").split())
    assert f"its `vocab_size` must be {ByteTokenizer.vocab_size} or more" in text
