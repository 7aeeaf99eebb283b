"""Checkpoints crossing between nano and official DeepSpeed on gloo ranks: official resumes
nano's files, and official's own files after nano resharded them for another world size (see
tests/nano/checkpoint_interop_workers.py; nano resuming official's files is test_checkpoints.py's
official cross-load)."""

import pytest

import tests.nano.checkpoint_interop_workers as interop
from tests.nano.checkpoint_interop_workers import nano_to_official_worker
from tests.spawn import run_distributed

pytestmark = [pytest.mark.slow, pytest.mark.official]


def test_official_resumes_nano_checkpoints_and_trains_as_nano_does(tmp_path):
    cases = [(1, "fp32"), (2, "fp32"), (3, "fp32"), (3, "bf16")]
    assert run_distributed(nano_to_official_worker, 2, str(tmp_path), cases) == []


SUB_GROUPS = 40  # elements: official's stage 3 then splits each parameter group into several sub-groups


def test_official_trains_on_at_three_ranks_from_its_two_rank_checkpoint_resharded_by_nano(tmp_path):
    """Issue 22 part 3: official saves at W=2; `zero-lab checkpoint reshard` (checkpoint.offline) writes
    it for W=3; official resumes it at W=3. Every step, before the save and after the resume, equals
    the single-process reference on the same global batches; stage 3 with several sub-groups too."""
    from zero_lab.nano.checkpoint.offline import OpenCheckpoint, reshard_checkpoint
    cases = [(1, None), (2, None), (3, None), (3, SUB_GROUPS)]
    saved, resharded = str(tmp_path / "w2"), str(tmp_path / "w3")
    assert run_distributed(interop.save_worker, 2, saved, "official", cases, 2) == []
    for stage, sub_group_size in cases:
        reshard_checkpoint(OpenCheckpoint.open(interop.case_directory(saved, stage, sub_group_size)), 3,
                           interop.case_directory(resharded, stage, sub_group_size))
    assert run_distributed(interop.resume_worker, 3, resharded, "official", cases, [2, 2], 2) == []
    # nano reads official's sub-groups too, at another world size, without the offline reshard
    assert run_distributed(interop.resume_worker, 3, saved, "nano", [(3, SUB_GROUPS)], [2, 2], 2) == []


def test_official_resumes_nano_stage3_files_with_several_sub_groups(tmp_path):
    """nano writes official's sub-groups (sub_group_size) in its stage-3 files, so official resumes them."""
    root = str(tmp_path)
    assert run_distributed(interop.save_worker, 2, root, "nano", [(3, SUB_GROUPS)], 2) == []
    assert run_distributed(interop.resume_worker, 2, root, "official", [(3, SUB_GROUPS)], [2, 2], 2) == []
