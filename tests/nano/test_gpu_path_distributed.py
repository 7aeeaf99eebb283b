"""The GPU path's behaviour that needs ranks (issue 17): fp16's reduction order (finding 6), and a
world of one that still runs every collective (how `make gpu-check` puts nano's calls through
NCCL on one GPU), both on gloo here."""

from __future__ import annotations

import pytest

from tests.nano import gpu_path_workers as workers
from tests.spawn import run_distributed

pytestmark = pytest.mark.slow  # spawns gloo ranks


@pytest.mark.parametrize("run_them", [True, False])
def test_a_world_of_one_runs_every_collective_when_asked(run_them):
    assert run_distributed(workers.world_of_one_worker, 1, run_them) == []


def test_fp16_gradients_are_divided_before_the_sum_as_official_stages_1_to_3_do():
    assert run_distributed(workers.fp16_order_worker, 2) == []


def test_stage_1_and_2_publish_gathers_into_the_flat_buffer_in_one_call():
    assert run_distributed(workers.publish_worker, 2) == []
