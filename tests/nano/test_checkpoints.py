"""Checkpoints on gloo ranks: exact resume, another world size, a rank killed mid-save, and
official DeepSpeed's tools and checkpoints (see tests/nano/checkpoint_workers.py)."""

import os

import pytest
import torch

from tests.nano.checkpoint_workers import (RESUME_CASES, directory_of, killed_mid_save_worker, official_cross_load_worker,
                                           resume_after_kill_worker, reshard_resume_worker, reshard_save_worker,
                                           resume_worker, save_worker, zero_to_fp32_worker)
from tests.spawn import run_distributed
from zero_lab.nano.checkpoint import files as checkpoint_files

pytestmark = pytest.mark.slow


def test_resume_in_fresh_processes_is_bitwise_exact_at_every_stage_and_precision(tmp_path):
    assert run_distributed(save_worker, 2, str(tmp_path), RESUME_CASES) == []
    for stage, precision in RESUME_CASES:
        directory = directory_of(str(tmp_path), stage, precision)
        tag = os.path.join(directory, open(os.path.join(directory, checkpoint_files.LATEST)).read())
        for name in sorted(os.listdir(tag)):
            oversized = _tensors_saved_with_more_storage_than_they_hold(os.path.join(tag, name))
            assert not oversized, (stage, precision, name, oversized)
    assert run_distributed(resume_worker, 2, str(tmp_path), RESUME_CASES) == []


def _tensors_saved_with_more_storage_than_they_hold(path: str) -> list[str]:
    """torch.save writes a view's whole storage: a rank's partition saved as a view of the whole flat
    buffer would make every rank's file hold the whole model. Each saved tensor must own exactly its bytes."""
    stored = torch.load(path, map_location="cpu", weights_only=False)
    oversized, pending = [], [("", stored)]
    while pending:
        path, item = pending.pop()
        if isinstance(item, torch.Tensor):
            if item.untyped_storage().nbytes() > item.numel() * item.element_size():
                oversized.append(f"{path}: {item.numel() * item.element_size()} B in a "
                                 f"{item.untyped_storage().nbytes()} B storage")
        elif isinstance(item, dict):
            pending += [(f"{path}/{key}", value) for key, value in item.items()]
        elif isinstance(item, (list, tuple)):
            pending += [(f"{path}/{index}", value) for index, value in enumerate(item)]
    return oversized


def test_saved_at_two_ranks_resumes_at_three_then_at_one_as_the_global_batch_reference(tmp_path):
    stages = [1, 2, 3]
    assert run_distributed(reshard_save_worker, 2, str(tmp_path), stages, 2) == []
    assert run_distributed(reshard_resume_worker, 3, str(tmp_path), stages, [2, 2], 2) == []
    assert run_distributed(reshard_resume_worker, 1, str(tmp_path), stages, [2, 2, 3, 3], 2) == []


def test_a_rank_killed_mid_save_leaves_latest_on_the_last_complete_checkpoint(tmp_path):
    root = str(tmp_path)
    verdict = run_distributed(killed_mid_save_worker, 2, root)
    assert verdict and all(line.endswith("exited with -9 before reporting") for line in verdict), verdict
    partial = os.listdir(checkpoint_files.partial_directory(root, "global_step2"))
    assert checkpoint_files.optim_states_name("fp32", 0) in partial  # rank 0 had written its files
    assert open(os.path.join(root, checkpoint_files.LATEST)).read() == "global_step1"
    assert not os.path.exists(os.path.join(root, "global_step2"))
    assert run_distributed(resume_after_kill_worker, 2, root) == []
    assert open(os.path.join(root, checkpoint_files.LATEST)).read() == "global_step2"


@pytest.mark.official
def test_official_zero_to_fp32_reads_nano_checkpoints_exactly(tmp_path):
    assert run_distributed(zero_to_fp32_worker, 2, str(tmp_path)) == []


@pytest.mark.official
def test_nano_resumes_official_checkpoints_as_official_does(tmp_path):
    assert run_distributed(official_cross_load_worker, 2, str(tmp_path)) == []
