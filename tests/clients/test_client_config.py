"""What accelerate (and so the Hugging Face Trainer) always writes into the config it hands
`deepspeed.initialize`: `steps_per_print` as infinity (accelerate's DeepSpeedPlugin: "this will
stop deepspeed from logging"). Official DeepSpeed accepts it; nano must too, and never print."""

import math

from zero_lab.nano.config import load_config


def test_steps_per_print_infinity_is_accepted_and_means_never():
    config = load_config({"train_micro_batch_size_per_gpu": 1, "steps_per_print": math.inf}, world_size=1)
    assert config.steps_per_print == math.inf
    assert all(step % config.steps_per_print != 0 for step in range(1, 1000))
    assert load_config({"train_micro_batch_size_per_gpu": 1}, world_size=1).steps_per_print == 10
