"""The unit policy: which parameters share a flat buffer at each stage (pure: no process group)."""

import torch

from tests.nano.stage3_reference import build_trapnet
from zero_lab.nano.config import load_config
from zero_lab.nano.policies.stage3_units import choose_units

BASE = {"train_micro_batch_size_per_gpu": 1, "optimizer": {"type": "AdamW"}}


def units_of(model, **zero):
    config = load_config({**BASE, "zero_optimization": zero})
    return choose_units(model, list(model.parameters()), config.zero_optimization)


def names(units):
    return [(unit.name, len(unit.parameters), unit.sharded) for unit in units]


def test_below_stage_3_the_whole_model_is_one_unit():
    model = build_trapnet()
    assert names(units_of(model, stage=2)) == [("model", len(list(model.parameters())), False)]


def test_stage_3_units_are_each_modules_own_parameters_the_root_and_the_persistent_parameters():
    """As official fetches (`recurse=False`): each module's own parameters are a unit; the tied
    embedding/head, owned by two modules, is one parameter of the root; parameters of at most the
    threshold (6-element norms and biases) are persistent, each a unit of its own (official partitions
    each persistent parameter on its own)."""
    model = build_trapnet()
    units = units_of(model, stage=3, stage3_param_persistence_threshold=6)
    small = [name for name, parameter in model.named_parameters() if parameter.numel() <= 6]
    assert len(small) == 4 * 3 + 2
    assert names(units) == [*((f"persistent:{name}", 1, False) for name in small), ("blocks.0.linear", 1, True),
                            ("blocks.1.linear", 1, True), ("blocks.2.linear", 1, True), ("spare.0.linear", 1, True),
                            ("root", 1, True)]
    assert units[-1].parameters == [model.embed.weight] and model.head.weight is model.embed.weight
    every = [parameter for unit in units for parameter in unit.parameters]
    assert len(every) == len(set(every)) == len(list(model.parameters()))  # each in exactly one unit


def test_the_model_persistence_threshold_caps_the_persistent_total():
    units = units_of(build_trapnet(), stage=3, stage3_param_persistence_threshold=6,
                     stage3_model_persistence_threshold=12)
    assert [sharded for _, _, sharded in names(units)].count(False) == 2


def test_leaf_module_names_the_units_and_shared_parameters_go_to_the_root():
    """DeepSpeed's leaf_module (classes, names, suffixes) chooses the modules fetched whole (the
    others keep one unit per module); a parameter reachable from two of them belongs to the root,
    whole for every use."""
    model = build_trapnet()
    model.blocks[2].linear = model.blocks[0].linear  # one module in two blocks
    units = units_of(model, stage=3, stage3_param_persistence_threshold=6, leaf_module={"classes": ["Block"]})
    # blocks 0 and 2 keep nothing of their own (the shared linear is the root's, the norms persistent)
    assert [unit.name for unit in units if unit.sharded] == ["blocks.1", "spare.0", "root"]
    assert any(parameter is model.blocks[0].linear.weight for parameter in units[-1].parameters)
    by_suffix = units_of(build_trapnet(), stage=3, stage3_param_persistence_threshold=6,
                         leaf_module={"name_suffixes": ".1"})
    assert [unit.name for unit in by_suffix if unit.sharded] == ["blocks.0.linear", "blocks.1", "blocks.2.linear",
                                                                 "spare.0.linear", "root"]
    by_name = units_of(build_trapnet(), stage=3, stage3_param_persistence_threshold=6,
                       leaf_module={"names": ["blocks"]})
    assert [unit.name for unit in by_name if unit.sharded] == ["blocks", "spare.0.linear", "root"]


def test_hugging_face_linear_layers_are_the_units():
    from transformers import Qwen3Config, Qwen3ForCausalLM

    with torch.device("meta"):
        model = Qwen3ForCausalLM(Qwen3Config(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=3,
                                             num_attention_heads=2, num_key_value_heads=1, head_dim=8,
                                             tie_word_embeddings=True))
    units = units_of(model, stage=3, stage3_param_persistence_threshold=16)
    linears = [f"model.layers.{layer}.{name}" for layer in range(3) for name in
               ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
                "mlp.up_proj", "mlp.down_proj")]
    norms = [name for name, parameter in model.named_parameters() if parameter.numel() <= 16]
    assert [unit.name for unit in units] == [*(f"persistent:{name}" for name in norms), *linears, "root"]
    assert units[-1].parameters == [model.model.embed_tokens.weight]  # the head is tied to it
