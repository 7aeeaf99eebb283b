"""A direct `initialize` with Hugging Face's ZeRO-3 config template, whose three hidden-size "auto"s
nano resolves as the HF Trainer does (`zero_lab.nano.config.loading.HIDDEN_SIZE_RULES`)."""

from __future__ import annotations

import zero_lab.nano as nano
from tests.nano.stage3_reference import decay_groups
from tests.nano.stage3_workers import MICRO_SIZE, qwen3_beside_reference, train_qwen3_beside_reference
from tests.nano.workers import LR, WEIGHT_DECAY
from tests.tolerances import ADAM_EPS

CLIPPING = 1.0  # the Trainer's max_grad_norm, which it writes into gradient_clipping

# The zero_optimization section of the ZeRO-3 template in Hugging Face's DeepSpeed guide
# (docs/source/en/deepspeed.md, "ZeRO-3"), with the keys the Trainer would fill given explicitly.
HF_ZERO3_TEMPLATE = {
    "train_micro_batch_size_per_gpu": MICRO_SIZE,
    "gradient_accumulation_steps": 1,
    "gradient_clipping": CLIPPING,
    "optimizer": {"type": "AdamW", "params": {"lr": LR, "eps": ADAM_EPS, "weight_decay": WEIGHT_DECAY}},
    "zero_optimization": {
        "stage": 3,
        "offload_optimizer": {"device": "cpu", "pin_memory": True},
        "offload_param": {"device": "cpu", "pin_memory": True},
        "overlap_comm": True,
        "contiguous_gradients": True,
        "sub_group_size": 1e9,
        "reduce_bucket_size": "auto",
        "stage3_prefetch_bucket_size": "auto",
        "stage3_param_persistence_threshold": "auto",
        "stage3_max_live_parameters": 1e9,
        "stage3_max_reuse_distance": 1e9,
        "stage3_gather_16bit_weights_on_model_save": True,
    },
}
RESOLVED_KEYS = ("reduce_bucket_size", "stage3_prefetch_bucket_size", "stage3_param_persistence_threshold")


def template_worker(rank: int, world_size: int, config: dict, filled_by_hf: dict) -> list[str]:
    """initialize takes `config` (the template) as it is; its resolved keys are what the HF Trainer
    fills in (`filled_by_hf`), and its steps match torch's AdamW (clipped) on the global batch."""
    model, reference_model, reference = qwen3_beside_reference()
    engine, *_ = nano.initialize(model=model, model_parameters=decay_groups(model, WEIGHT_DECAY), config=config)
    zero = engine.nano_config.zero_optimization
    resolved = {key: getattr(zero, key) for key in RESOLVED_KEYS}
    failures = [] if resolved == filled_by_hf else [f"nano resolved {resolved}, the HF Trainer fills {filled_by_hf}"]
    return failures + train_qwen3_beside_reference(engine, model, reference_model, reference, rank, world_size,
                                                   clipping=CLIPPING)
