"""Engine calls and config keys the HF Trainer and accelerate use, beside official DeepSpeed (issue 18)."""

import pytest

from tests.nano import client_surface_workers as workers
from tests.spawn import run_distributed

pytestmark = [pytest.mark.official, pytest.mark.slow]


def test_a_client_adam_or_adamw_and_its_lambda_lr_train_as_on_official():
    assert run_distributed(workers.client_optimizer_worker, 2) == []


def test_legacy_cpu_offload_and_torch_adam_default_decay_match_official():
    assert run_distributed(workers.legacy_keys_worker, 2) == []


def test_bf16_casts_parameters_not_buffers_and_16_bit_saving_matches_official():
    assert run_distributed(workers.bf16_and_saving_worker, 2) == []
