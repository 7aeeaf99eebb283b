"""What a run's model looks like without building it: the presets' configurations, each preset's
parameter table, and the weight-decay grouping. Pure data: no torch, no transformers, so
`zero-lab explain` answers at once; `models.py` builds the same presets for real, and a test checks
the table against the built model.

A preset is a `transformers.Qwen3ForCausalLM`; its parameters, in `named_parameters()` order:
    model.embed_tokens.weight                          vocab x hidden
    per decoder layer i (model.layers.i, one stage-3 block each):
        self_attn.{q,k,v,o}_proj.weight, self_attn.{q,k}_norm.weight,
        mlp.{gate,up,down}_proj.weight, input_layernorm.weight, post_attention_layernorm.weight
    model.norm.weight                                  hidden
    lm_head.weight                                     vocab x hidden, unless tied to the embedding
"""

from __future__ import annotations

from pathlib import Path

from zero_lab.nano.policies.unit_policy import ParameterEntry
from zero_lab.workload.errors import WorkloadError
from zero_lab.workload.tokenizer import ByteTokenizer

DEFAULT_SEQ_LEN = 128  # tokens per sample when no --seq-len is given (harness and estimates)
SHARED = {"rms_norm_eps": 1e-6, "rope_theta": 1_000_000.0, "use_cache": False}
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


# Files that hold a Hugging Face model's weights; a model directory without any is its config alone.
WEIGHT_PATTERNS = ("*.safetensors", "*.bin", "*.pt", "*.pth", "*.safetensors.index.json", "*.bin.index.json")


def check_model_name(name: str, flag: str = "--model-name") -> None:
    """A preset name, a Hugging Face config.json (the file, or a directory holding it, with or
    without weights); `flag` is how the user gave it (the harness's --model-name, the CLI's --model)."""
    if name in PRESETS:
        return
    path = Path(name).expanduser()
    if not path.exists():
        raise WorkloadError(f"{flag} {name!r} is neither a preset ({', '.join(PRESETS)}) "
                            "nor an existing directory or config.json",
                            "Pick a preset, or give a local Hugging Face model directory or its config.json")
    if config_path(name) is None:
        raise WorkloadError(f"{path} has no config.json",
                            "Give a Hugging Face model directory (config, weights, tokenizer) or a config.json")


def config_path(name: str) -> Path | None:
    """The Hugging Face config.json of a model that is not a preset: the file itself (any *.json
    file), or the one in the directory; None where there is none."""
    path = Path(name).expanduser()
    if path.is_file() and path.suffix == ".json":
        return path
    return path / "config.json" if (path / "config.json").is_file() else None


def model_source(name: str) -> str:
    """Where a model's weights come from: "preset" (built in, random), "config" (a config.json alone,
    or a directory without weight files: built from it, random, with the byte tokenizer) or
    "pretrained" (a directory with weights and its own tokenizer)."""
    if name in PRESETS:
        return "preset"
    path = Path(name).expanduser()
    if path.is_file() or not any(next(path.glob(pattern), None) for pattern in WEIGHT_PATTERNS):
        return "config"
    return "pretrained"


def decays(shape: tuple[int, ...]) -> bool:
    """The harness's grouping: weight decay on matrices only, not on norms and biases (1-D)."""
    return len(shape) >= 2


def preset_parameters(name: str) -> list[ParameterEntry]:
    """The preset's trainable parameters in `named_parameters()` order, each fetched by the module
    owning it (`stage3_units.fetch_modules`); a tied embedding by the head too."""
    config = PRESETS[name]
    hidden, intermediate, head = config["hidden_size"], config["intermediate_size"], config["head_dim"]
    queries, keys = config["num_attention_heads"] * head, config["num_key_value_heads"] * head
    tied = ("lm_head",) if config["tie_word_embeddings"] else ()  # the head uses the embedding's weight
    entries = [ParameterEntry("model.embed_tokens.weight", (config["vocab_size"], hidden),
                              ("model.embed_tokens", *tied))]
    for layer in range(config["num_hidden_layers"]):
        block = f"model.layers.{layer}"
        shapes = {"self_attn.q_proj.weight": (queries, hidden), "self_attn.k_proj.weight": (keys, hidden),
                  "self_attn.v_proj.weight": (keys, hidden), "self_attn.o_proj.weight": (hidden, queries),
                  "self_attn.q_norm.weight": (head,), "self_attn.k_norm.weight": (head,),
                  "mlp.gate_proj.weight": (intermediate, hidden), "mlp.up_proj.weight": (intermediate, hidden),
                  "mlp.down_proj.weight": (hidden, intermediate), "input_layernorm.weight": (hidden,),
                  "post_attention_layernorm.weight": (hidden,)}
        entries += [ParameterEntry(f"{block}.{name}", shape) for name, shape in shapes.items()]
    entries.append(ParameterEntry("model.norm.weight", (hidden,)))
    if not config["tie_word_embeddings"]:
        entries.append(ParameterEntry("lm_head.weight", (config["vocab_size"], hidden)))
    return [entry if entry.blocks else ParameterEntry(entry.name, entry.shape, (entry.name.rpartition(".")[0],))
            for entry in entries]


def preset_blocks(name: str) -> list[str]:
    """The stage-3 blocks of a preset: every module fetched as one (each owning parameters), in order."""
    table = preset_parameters(name)
    owners = [entry.name.rpartition(".")[0] for entry in table]
    return list(dict.fromkeys(owners + [block for entry in table for block in entry.blocks]))


def preset_module_calls(name: str) -> tuple[list[str], list[str]]:
    """The modules a preset's training micro-step calls (Qwen3 as transformers 5 writes it; "" is
    the model): in the order the forward calls them, then in the order the backward's gradients
    reach their outputs, which is what stage 3 records (`nano.unit_gathering`). The backward is not
    the forward reversed: a module whose output is its last child's output (the model and its
    final norm, an MLP and its down_proj, an attention and its o_proj) comes after that child, the
    rotary embedding (no gradient) not at all."""
    attention = ["q_proj", "q_norm", "k_proj", "k_norm", "v_proj", "o_proj"]
    mlp = ["gate_proj", "act_fn", "up_proj", "down_proj"]
    forward, backward = ["", "model", "model.embed_tokens", "model.rotary_emb"], ["", "lm_head", "model.norm", "model"]
    layers = [f"model.layers.{layer}" for layer in range(PRESETS[name]["num_hidden_layers"])]
    for layer in layers:
        forward += [layer, f"{layer}.input_layernorm", f"{layer}.self_attn",
                    *[f"{layer}.self_attn.{module}" for module in attention], f"{layer}.post_attention_layernorm",
                    f"{layer}.mlp", *[f"{layer}.mlp.{module}" for module in mlp]]
    for layer in reversed(layers):
        backward += [layer, f"{layer}.mlp.down_proj", f"{layer}.mlp",
                     *[f"{layer}.mlp.{module}" for module in reversed(mlp[:-1])], f"{layer}.post_attention_layernorm",
                     f"{layer}.self_attn.o_proj", f"{layer}.self_attn",
                     *[f"{layer}.self_attn.{module}" for module in reversed(attention[:-1])],
                     f"{layer}.input_layernorm"]
    return forward + ["model.norm", "lm_head"], backward + ["model.embed_tokens"]
