"""Config loading: DeepSpeed's batch arithmetic, "auto", and one-line errors that name the field."""

import json

import pytest

from zero_lab.nano.config import load_config
from zero_lab.nano.errors import NanoConfigError
from zero_lab.nano.facade.official_config import to_official_config

BASE = {"train_micro_batch_size_per_gpu": 2, "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}}


def with_(**changes):
    config = json.loads(json.dumps(BASE))
    for dotted, value in changes.items():
        node = config
        *parents, leaf = dotted.split("__")
        for parent in parents:
            node = node.setdefault(parent, {})
        if value is DELETE:
            node.pop(leaf, None)
        else:
            node[leaf] = value
    return config


DELETE = object()

BAD_CONFIGS = [
    (with_(zero_optimization={"stage": 3, "stage3_allgather_sequential": True}), "stage3_allgather_sequential"),
    (with_(zero_optimization={"stage": 3, "stage3_module_granularity_threshold": 10}),
     "stage3_module_granularity_threshold"),
    (with_(zero_optimization__stage=7), "zero_optimization.stage"),
    (with_(zero_optimization__offload_optimizer={"device": "cpu"}), "offload"),
    (with_(zero_optimization__reduce_bucket_sise=10), "zero_optimization.reduce_bucket_sise"),
    (with_(zero_optimization__round_robin_gradients=True), "known to official DeepSpeed"),
    (with_(tensorboard={"enabled": True}), "'tensorboard' is known to official DeepSpeed"),
    (with_(train_micro_batch_size=2), "unknown config key 'train_micro_batch_size'"),
    (with_(optimizer__type="Lamb"), "optimizer.type 'Lamb'"),
    (with_(optimizer__type="SGD"), "optimizer.type"),
    (with_(optimizer__params__lr=-1), "optimizer.params.lr"),
    (with_(optimizer__params__betas=[0.9]), "optimizer.params.betas"),
    (with_(optimizer__params__momentum=0.9), "optimizer.params.momentum"),
    (with_(gradient_clipping=-1.0), "gradient_clipping"),
    (with_(fp16={"enabled": True}, bf16={"enabled": True}), "enable at most one"),
    (with_(fp16__hysteresis=0), "fp16.hysteresis"),
    (with_(train_batch_size=7, gradient_accumulation_steps=2), "train_batch_size 7"),
    (with_(train_micro_batch_size_per_gpu=DELETE), "train_batch_size or train_micro_batch_size_per_gpu"),
    (with_(optimizer__params__lr="auto"), "optimizer.params.lr"),
    (with_(communication_data_type="int8"), "communication_data_type"),
    (with_(zero_optimization__contiguous_gradients=False), "contiguous_gradients"),
    (with_(scheduler={"type": "OneCycle", "params": {}}), "OneCycle"),
    (with_(fp16={"enabled": True, "auto_cast": True}), "'fp16.auto_cast' is known to official DeepSpeed"),
    (with_(zero_optimization={"stage": 2, "allgather_bucket_size": 5}), "zero_optimization.allgather_bucket_size"),
    (with_(zero_optimization={"stage": 0}, bf16={"enabled": True}, data_types={"grad_accum_dtype": "fp32"}),
     "data_types.grad_accum_dtype fp32"),
    (with_(zero_optimization={"stage": 1, "offload_optimizer": {"device": "cpu"}}, bf16={"enabled": True},
           data_types={"grad_accum_dtype": "fp32"}), "stage 1 with offload_optimizer accumulates gradients in bf16"),
    (with_(zero_optimization={"stage": 3}, bf16={"enabled": True}, data_types={"grad_accum_dtype": "bf16"}),
     "data_types.grad_accum_dtype bf16"),
    (with_(data_types={"param_dtype": "bf16"}), "'data_types.param_dtype' is known to official DeepSpeed"),
    (with_(gradient_allreduce_op="max"), "gradient_allreduce_op"),
    (with_(zero_optimization__stage="2"), "zero_optimization.stage"),
    (with_(zero_optimization__overlap_comm=1), "zero_optimization.overlap_comm"),
]


@pytest.mark.parametrize("config,named", BAD_CONFIGS, ids=[named for _, named in BAD_CONFIGS])
def test_bad_config_is_one_line_naming_the_field(config, named):
    with pytest.raises(NanoConfigError) as raised:
        load_config(config, world_size=2)
    message = str(raised.value)
    assert named in message
    assert "\n" not in message


def test_missing_and_malformed_files(tmp_path):
    with pytest.raises(NanoConfigError, match="does not exist"):
        load_config(str(tmp_path / "absent.json"))
    broken = tmp_path / "broken.json"
    broken.write_text("{ not json")
    with pytest.raises(NanoConfigError, match="not valid JSON"):
        load_config(str(broken))


@pytest.mark.parametrize("given,world_size,expected", [
    ({"train_micro_batch_size_per_gpu": 2}, 3, (6, 2, 1)),
    ({"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 4}, 2, (16, 2, 4)),
    ({"train_batch_size": 16, "train_micro_batch_size_per_gpu": 2}, 2, (16, 2, 4)),
    ({"train_batch_size": 16, "gradient_accumulation_steps": 2}, 2, (16, 4, 2)),
    ({"train_batch_size": 8}, 4, (8, 2, 1)),
    ({"train_batch_size": "auto", "train_micro_batch_size_per_gpu": 3, "gradient_accumulation_steps": "auto"}, 2, (6, 3, 1)),
])
def test_batch_sizes_are_inferred_as_deepspeed_does(given, world_size, expected):
    config = load_config({**given, "optimizer": BASE["optimizer"]}, world_size=world_size)
    assert (config.train_batch_size, config.train_micro_batch_size_per_gpu,
            config.gradient_accumulation_steps) == expected


def test_auto_buckets_follow_the_hidden_size_and_defaults_match_deepspeed():
    config = load_config(with_(zero_optimization={"stage": 2, "reduce_bucket_size": "auto"}), hidden_size=64)
    assert config.zero_optimization.reduce_bucket_size == 64 * 64
    assert config.zero_optimization.allgather_bucket_size == 500_000_000
    assert config.zero_optimization.reduce_scatter is True and config.zero_optimization.overlap_comm is False
    assert config.optimizer.params.weight_decay == 0.0  # DeepSpeed's FusedAdam default
    assert load_config(with_(optimizer__type="adamw", bfloat16={"enabled": True})).precision == "bf16"


def test_adam_type_is_decoupled_unless_adam_w_mode_is_false():
    assert load_config(with_(optimizer__type="Adam")).optimizer.decoupled_weight_decay
    assert not load_config(with_(optimizer__type="Adam", optimizer__params__adam_w_mode=False)).optimizer.decoupled_weight_decay


def test_official_config_is_accepted_by_deepspeed():
    from deepspeed.runtime.config import DeepSpeedConfig
    nano_config = with_(zero_optimization={"stage": 2, "reduce_scatter": False, "overlap_comm": True},
                        gradient_clipping=1.0, bf16={"enabled": True}, steps_per_print=5)
    official = to_official_config(nano_config, device="cpu")
    assert official["optimizer"]["params"]["torch_adam"] is True
    assert "torch_adam" not in nano_config["optimizer"]["params"]
    parsed = DeepSpeedConfig(official, world_size=1) if "world_size" in DeepSpeedConfig.__init__.__code__.co_varnames \
        else DeepSpeedConfig(official)
    assert parsed.zero_optimization_stage == 2 and parsed.gradient_clipping == 1.0
    multi_rank = {"train_batch_size": 4, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1,
                  "optimizer": BASE["optimizer"]}
    assert to_official_config(multi_rank)["train_batch_size"] == 4  # valid at 2 ranks: not checked at 1
    with pytest.raises(NanoConfigError, match="fp16 on CPU"):
        to_official_config(with_(fp16={"enabled": True}), device="cpu")


@pytest.mark.parametrize("accepted", [
    with_(zero_optimization={"stage": 2, "stage3_prefetch_bucket_size": 10, "stage3_param_persistence_threshold": 5,
                             "stage3_max_live_parameters": 7, "stage3_max_reuse_distance": 3, "sub_group_size": 100,
                             "stage3_gather_16bit_weights_on_model_save": True}),
    with_(bf16={"enabled": True, "check_grad_overflow": False, "immediate_grad_update": False}),
    with_(zero_optimization={"stage": 2}, bf16={"enabled": True, "immediate_grad_update": True}),
    with_(zero_optimization={"stage": 2}, bf16={"enabled": True}, data_types={"grad_accum_dtype": "fp32"}),
    with_(zero_optimization={"stage": 1}, bf16={"enabled": True}, data_types={"grad_accum_dtype": "bf16"}),
    with_(zero_optimization={"stage": 3}, bf16={"enabled": True}, data_types={"grad_accum_dtype": "fp32"}),
    with_(zero_optimization={"stage": 1}, bf16={"enabled": True}, data_types={"grad_accum_dtype": "fp32"}),
    with_(zero_optimization={"stage": 0}, bf16={"enabled": True, "immediate_grad_update": True}),
    with_(gradient_allreduce_op="SUM"),
], ids=["stage3 keys below stage 3", "bf16 overflow check off", "immediate update at stage 2",
        "fp32 accumulation at stage 2", "bf16 accumulation at stage 1", "fp32 accumulation at stage 3",
        "fp32 accumulation at stage 1", "immediate update at stage 0", "sum"])
def test_keys_official_deepspeed_accepts_are_accepted_with_its_meaning(accepted):
    """Keys official DeepSpeed takes (and ignores below stage 3, for the stage-3 ones) load, and
    DeepSpeed's own config class accepts the same dict."""
    from deepspeed.runtime.config import DeepSpeedConfig
    config = load_config(accepted, world_size=1)
    assert config.gradient_allreduce_op in ("mean", "sum")
    DeepSpeedConfig(to_official_config(accepted, device="cpu"))


def test_two_precisions_name_both_keys_without_dumping_the_config():
    with pytest.raises(NanoConfigError) as raised:
        load_config(with_(fp16={"enabled": True}, bf16={"enabled": True}))
    assert str(raised.value) == "fp16.enabled and bf16.enabled are both true; enable at most one"


def test_official_gets_nanos_adam_defaults_spelled_out():
    """torch.optim.AdamW, which official DeepSpeed uses with torch_adam, defaults weight_decay to
    0.01; DeepSpeed's (and nano's) default is 0. The conversion writes nano's values, so a config
    that leaves them out trains the same on both sides, and the user's explicit values stay."""
    official = to_official_config(BASE, device="cpu")["optimizer"]["params"]
    assert official["weight_decay"] == 0.0 and official["eps"] == 1e-8 and list(official["betas"]) == [0.9, 0.999]
    assert official["lr"] == 1e-3
    explicit = to_official_config(with_(optimizer__params__weight_decay=0.1), device="cuda")["optimizer"]["params"]
    assert explicit["weight_decay"] == 0.1


@pytest.mark.parametrize("stage, given, expected", [(3, None, True), (2, None, False), (0, None, False),
                                                    (3, False, False), (1, True, True)])
def test_overlap_comm_defaults_to_true_at_stage_3_as_official_does(stage, given, expected):
    """deepspeed/runtime/zero/config.py: overlap_comm unset is true at stage 3 (weights) only."""
    zero = {"stage": stage} | ({} if given is None else {"overlap_comm": given})
    assert load_config({"train_micro_batch_size_per_gpu": 1, "zero_optimization": zero}).zero_optimization.overlap_comm is expected


@pytest.mark.official
def test_overlap_comm_default_is_officials():
    """nano's default for an unset overlap_comm equals official DeepSpeed's own config class at every stage."""
    from deepspeed.runtime.zero.config import DeepSpeedZeroConfig

    for stage in (0, 1, 2, 3):
        mine = load_config({"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": stage}})
        assert mine.zero_optimization.overlap_comm is DeepSpeedZeroConfig(stage=stage).overlap_comm, stage


def hugging_face_fill(config: dict, hidden_size: int) -> dict:
    """The zero_optimization section the HF Trainer makes of `config` for a model of this hidden size
    (transformers' own `HfTrainerDeepSpeedConfig.trainer_config_finalize`)."""
    import copy
    import types

    from transformers.integrations.deepspeed import HfTrainerDeepSpeedConfig

    filled = HfTrainerDeepSpeedConfig(copy.deepcopy(config))
    model = types.SimpleNamespace(config=types.SimpleNamespace(hidden_size=hidden_size))
    filled.trainer_config_finalize(types.SimpleNamespace(get_warmup_steps=lambda steps: 0), model, 10)
    return filled.config["zero_optimization"]


@pytest.mark.parametrize("stage", [2, 3])
@pytest.mark.parametrize("hidden_size", [16, 1024, 4097])
def test_hidden_size_autos_are_what_the_hugging_face_trainer_fills_in(stage, hidden_size):
    from tests.nano.hf_template_workers import HF_ZERO3_TEMPLATE, RESOLVED_KEYS

    config = json.loads(json.dumps(HF_ZERO3_TEMPLATE))
    config["zero_optimization"]["stage"] = stage
    if stage < 3:  # the Trainer fills the stage-3 keys at stage 3 only; stage 2 has no offload_param
        for key in (*RESOLVED_KEYS[1:], "offload_param"):
            del config["zero_optimization"][key]
    expected = hugging_face_fill(config, hidden_size)
    zero = load_config(config, world_size=2, hidden_size=hidden_size).zero_optimization
    assert {key: getattr(zero, key) for key in RESOLVED_KEYS if key in expected} == {
        key: expected[key] for key in RESOLVED_KEYS if key in expected}
    stated = {"reduce_bucket_size": hidden_size * hidden_size, "stage3_prefetch_bucket_size": int(0.9 * hidden_size * hidden_size),
              "stage3_param_persistence_threshold": 10 * hidden_size}  # docs/nano.md, "Config"
    assert {key: expected[key] for key in RESOLVED_KEYS if key in expected} == {
        key: stated[key] for key in RESOLVED_KEYS if key in expected}


def test_a_stage_3_auto_below_stage_3_is_refused_as_the_trainer_leaves_it():
    with pytest.raises(NanoConfigError, match="stage3_prefetch_bucket_size' is \"auto\""):
        load_config(with_(zero_optimization={"stage": 2, "stage3_prefetch_bucket_size": "auto"}), hidden_size=8)


def test_hidden_size_autos_without_a_hidden_size_take_deepspeeds_defaults():
    zero = load_config(with_(zero_optimization={"stage": 3, "reduce_bucket_size": "auto",
                                                "stage3_prefetch_bucket_size": "auto",
                                                "stage3_param_persistence_threshold": "auto"})).zero_optimization
    assert (zero.reduce_bucket_size, zero.stage3_prefetch_bucket_size, zero.stage3_param_persistence_threshold) == (
        500_000_000, 50_000_000, 100_000)


@pytest.mark.slow
@pytest.mark.parametrize("world_size", [2, 3])
def test_a_direct_initialize_takes_hugging_faces_zero3_template(world_size):
    from tests.nano.hf_template_workers import HF_ZERO3_TEMPLATE, RESOLVED_KEYS, template_worker
    from tests.nano.stage3_workers import tiny_qwen3
    from tests.spawn import run_distributed

    filled = hugging_face_fill(HF_ZERO3_TEMPLATE, tiny_qwen3(checkpointing=False).config.hidden_size)
    assert run_distributed(template_worker, world_size, HF_ZERO3_TEMPLATE, {key: filled[key] for key in RESOLVED_KEYS}) == []
