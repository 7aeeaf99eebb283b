"""harness/train.py --impl fsdp2 on CPU (tiny, world size 2, fp32): the log contract, FSDP2's losses
against nano's step by step, its bytes between steps against its formula, and its all-gather and
reduce-scatter bytes per step against its layout.

The harness's training runs in spawned worlds (tests/harness_world.py; the torchrun launch itself
is tests/harness/test_train_torchrun.py's and the CLI tests'): one world of 2 ranks per impl trains
stages 2 and 3 in turn, once per module."""

from __future__ import annotations

import pytest

from tests.harness.test_train_torchrun import REPO, STEPS, WORLD_SIZE, harness_arguments, read_log
from tests.harness_world import Worlds
from zero_lab.fsdp2.memory_formula import FP32, chunk_rows, moment_bytes
from zero_lab.workload.models import build_model

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """run(impl, stage) -> the parsed rank-0 log of that run; the first call for an impl trains
    its stages 2 and 3 in one spawned world."""
    configs = REPO / "harness" / "configs"
    worlds = Worlds(WORLD_SIZE, {impl: {f"{impl}-{stage}": harness_arguments(configs / f"zero{stage}.json", impl)
                                        for stage in (2, 3)} for impl in ("fsdp2", "nano")}, tmp_path_factory.mktemp)
    return lambda impl, stage: read_log(worlds.output(f"{impl}-{stage}"))


@pytest.fixture(scope="module")
def model():
    return build_model("tiny", seed=0)


@pytest.mark.parametrize("stage", [2, 3])
def test_contract_lines_and_losses_match_nano(run, stage):
    fsdp2, nano = run("fsdp2", stage), run("nano", stage)
    assert (fsdp2["zero"]["impl"], fsdp2["zero"]["stage"], fsdp2["zero"]["world_size"]) == ("fsdp2", stage, WORLD_SIZE)
    assert fsdp2["model"]["optimizer"] == "torch.optim.AdamW" and fsdp2["model"]["params"] == nano["model"]["params"]
    assert [step for step, _ in fsdp2["opt_step"]] == list(range(1, STEPS + 1))
    for (step, ours), (_, theirs) in zip(fsdp2["opt_step"], nano["opt_step"]):
        assert abs(ours["loss"] - theirs["loss"]) <= 1e-5, f"step {step}: {ours['loss']} vs {theirs['loss']}"
        assert ours["lr"] == theirs["lr"]
        assert abs(ours["grad_norm"] - theirs["grad_norm"]) <= 1e-4 * theirs["grad_norm"]
    assert [warning["kind"] for warning in fsdp2["warn"]] == ["engine"]  # the keys FSDP2 has no use for


@pytest.mark.parametrize("stage", [2, 3])
def test_collective_bytes_follow_fsdp2s_layout(run, model, stage):
    """Each unit (4 blocks, then the root's own parameters) reduce-scatters its padded gradients
    once per step; stage 3 all-gathers it in the forward and again in the backward, stage 2 once."""
    log = run("fsdp2", stage)
    padded = sum(chunk_rows(p.shape[0], WORLD_SIZE, 0)[1] * p[0].numel() for p in model.parameters())
    unit_bytes = WORLD_SIZE * padded * FP32
    assert log["comm"]["reduce_scatter_single"]["bytes_per_step"] == unit_bytes
    assert log["comm"]["all_gather_single"]["bytes_per_step"] == (2 if stage == 3 else 1) * unit_bytes
    assert log["comm"]["all_reduce"]["bytes_per_step"] == FP32  # the gradient norm's squares


@pytest.mark.parametrize("stage", [2, 3])
def test_bytes_between_steps_equal_the_formula_exactly(run, model, stage):
    """After the step: FSDP2's model states, plus what the harness itself still holds: the model's
    buffers (RoPE's inv_freq), the last micro-batch (input_ids, attention_mask, labels: int64,
    2 x 32 each) and its loss (one fp32)."""
    log = run("fsdp2", stage)
    shapes = [tuple(parameter.shape) for parameter in model.parameters()]
    buffers = sum(buffer.numel() * buffer.element_size() for buffer in model.buffers())
    harness = buffers + 3 * 2 * 32 * 8 + FP32
    for step, fields in log["opt_step"]:
        assert fields["alloc_max_bytes"] == moment_bytes(shapes, WORLD_SIZE, "between_steps") + harness, step


@pytest.mark.parametrize("stage", [2, 3])
def test_the_predicted_peak_is_within_5_percent_of_the_measured_one(run, stage):
    """`analysis.memory.fsdp2_peak`, from the run's own [model] and [zero] lines as `zero-lab compare` reads them:
    at stage 2 every group's unsharded parameters at the turn, at stage 3 the layer and the next one in the
    backward. The steps after the first (whose peak includes building the model)."""
    from zero_lab.analysis.memory.peak_memory import predict_run_peak

    log = run("fsdp2", stage)
    predicted = predict_run_peak(log["model"], log["zero"], stage, "fp32", WORLD_SIZE).peak / 2**20
    measured = max(fields["peak_alloc_max_mb"] for step, fields in log["opt_step"] if step > 1)
    assert abs(predicted - measured) / measured < 0.05, (predicted, measured)
