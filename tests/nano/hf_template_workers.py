"""A direct `initialize` with Hugging Face's ZeRO-3 config template, whose three hidden-size "auto"s
nano resolves as the HF Trainer does (`zero_lab.nano.config.loading.HIDDEN_SIZE_RULES`)."""

from __future__ import annotations

import copy

import torch

import zero_lab.nano as nano
from tests.nano.reference import max_difference
from tests.nano.stage3_reference import decay_groups
from tests.nano.stage3_workers import tiny_qwen3
from tests.nano.workers import LR, WEIGHT_DECAY

STEPS, MICRO_SIZE, TOLERANCE, CLIPPING = 2, 2, 1e-5, 1.0  # the Trainer's max_grad_norm

# The zero_optimization section of the ZeRO-3 template in Hugging Face's DeepSpeed guide
# (docs/source/en/deepspeed.md, "ZeRO-3"), with the keys the Trainer would fill given explicitly.
HF_ZERO3_TEMPLATE = {
    "train_micro_batch_size_per_gpu": MICRO_SIZE,
    "gradient_accumulation_steps": 1,
    "gradient_clipping": CLIPPING,
    "optimizer": {"type": "AdamW", "params": {"lr": LR, "weight_decay": WEIGHT_DECAY}},
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
    """initialize takes `config` (the template) as it is; its resolved keys are what the HF Trainer fills in
    (`filled_by_hf`), and two steps match torch's AdamW (clipped) on the global batch."""
    failures = []
    initial = tiny_qwen3(checkpointing=False)
    reference_model = copy.deepcopy(initial)
    reference = torch.optim.AdamW(decay_groups(reference_model, WEIGHT_DECAY), lr=LR)
    model = copy.deepcopy(initial)
    engine, *_ = nano.initialize(model=model, model_parameters=decay_groups(model, WEIGHT_DECAY),
                                 config=config)
    zero = engine.nano_config.zero_optimization
    resolved = {key: getattr(zero, key) for key in RESOLVED_KEYS}
    if resolved != filled_by_hf:
        failures.append(f"nano resolved {resolved}, the HF Trainer fills {filled_by_hf}")
    for step in range(STEPS):
        def batch(which):
            generator = torch.Generator().manual_seed(1000 * step + which)
            return torch.randint(0, 32, (MICRO_SIZE, 6), generator=generator)

        ids = batch(rank)
        engine.backward(engine(input_ids=ids, labels=ids).loss)
        engine.step()
        every = torch.cat([batch(other) for other in range(world_size)])
        reference.zero_grad()
        reference_model(input_ids=every, labels=every).loss.backward()
        torch.nn.utils.clip_grad_norm_(reference_model.parameters(), CLIPPING)
        reference.step()
        with nano.zero.GatheredParameters(list(model.parameters())):
            difference = max_difference(model, reference_model)
        if not difference <= TOLERANCE:
            failures.append(f"step {step}: max |nano - reference| = {difference:.3g}")
    return failures
