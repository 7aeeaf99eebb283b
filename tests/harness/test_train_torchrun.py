"""harness/train.py on CPU (tiny, world size 2, fp32): under torchrun, the log contract; and what its
training computes: nano vs official losses, live bytes against the ZeRO formulas, and bytes per
collective per step.

One launch under torchrun (nano, stage 2: it starts 2 interpreters that import torch, transformers
and the engines, about 15 CPU s): its contract lines, and that it trains and moves exactly what the
same arguments do in a spawned world of 2 ranks (tests/harness_world.py). Every other fact is read
from such worlds: one for nano's runs in turn, one per official run (WORLDS). The launch and each
world run once per module and their rank-0 logs are reused.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.harness_world import Worlds
from tests.ports import free_port
from zero_lab.nano.layout import FlatLayout
from zero_lab.nano.memory.memory_formula import model_state_bytes
from zero_lab.workload.log_contract.log_lines import parse_line
from zero_lab.workload.models import build_model, parameter_groups
from zero_lab.workload.meters.wire_bytes import wire_bytes

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
WORLD_SIZE, STEPS = 2, 3
FP32 = 4
ZERO_KEYS = {"impl", "stage", "world_size", "reduce_scatter", "reduce_bucket_size",
             "allgather_bucket_size", "overlap_comm", "communication_data_type"}
MODEL_KEYS = {"name", "params", "param_dtype", "compute_dtype", "ds_precision", "device", "optimizer"}
OPTIMIZER = {"nano": "PartitionedAdam", "official": "torch.optim.AdamW"}  # official on CPU: torch_adam
STEP_KEYS = {"loss", "grad_norm", "lr", "loss_scale", "step_ms", "tokens_per_s", "alloc_max_mb",
             "reserved_max_mb", "peak_alloc_max_mb", "peak_reserved_max_mb", "comm_mb", "comm_wire_mb"}


def harness_arguments(config: Path, impl: str) -> list[str]:
    """harness/train.py's arguments for a run of `impl` with the config file `config`."""
    return ["--impl", impl, "--deepspeed_config", str(config), "--model-name", "tiny",
            "--steps", str(STEPS), "--batch-size", "2", "--seq-len", "32", "--seed", "0",
            # gloo ranks on any machine: two ranks would need two GPUs, and a GPU machine must pass
            # too (where `--device auto` would pick cuda), which also runs `--device cpu` beside CUDA
            "--device", "cpu"]


def torchrun_command(config: Path, impl: str) -> list[str]:
    return [str(Path(sys.executable).with_name("torchrun")), "--nnodes=1",
            f"--nproc-per-node={WORLD_SIZE}", "--rdzv-backend=c10d",
            f"--rdzv-endpoint=127.0.0.1:{free_port()}", str(REPO / "harness" / "train.py"),
            *harness_arguments(config, impl)]


def read_log(text: str) -> dict:
    """The contract lines of a rank-0 log, by tag ('opt_step' and 'comm' as lists)."""
    log = {"opt_step": [], "comm": {}, "warn": []}
    for line in text.splitlines():
        parsed = parse_line(line)
        if parsed is None:
            continue
        tag, step, fields = parsed
        if tag == "opt_step":
            log["opt_step"].append((step, fields))
        elif tag == "comm":
            log["comm"][fields["op"]] = fields
        elif tag == "warn":
            log["warn"].append(fields)
        else:
            log[tag] = fields
    return log


# The runs of the spawned worlds, (impl, stage, reduce_scatter) each: nano's in one world; each of
# official's in a world of its own, since official DeepSpeed's communication backend keeps the
# collectives it finds at its first init_distributed (the first run's meters) for the process's life.
WORLDS = [[("nano", 0, True), ("nano", 2, True), ("nano", 2, False), ("nano", 3, True)],
          [("official", 0, True)], [("official", 2, True)], [("official", 3, True)]]


@pytest.fixture(scope="module")
def config_path(tmp_path_factory):
    """config_path(stage, reduce_scatter) -> the harness's zero<stage>.json with that reduce_scatter."""
    def write(stage: int, reduce_scatter: bool) -> Path:
        config = json.loads((REPO / "harness" / "configs" / f"zero{stage}.json").read_text())
        config["zero_optimization"]["reduce_scatter"] = reduce_scatter
        path = tmp_path_factory.mktemp("config") / "config.json"
        path.write_text(json.dumps(config))
        return path
    return write


@pytest.fixture(scope="module")
def run(config_path, tmp_path_factory):
    """run(impl, stage, reduce_scatter=True) -> the parsed rank-0 log of that run; the first call
    for a run trains every run of its world (WORLDS)."""
    def name(impl: str, stage: int, reduce_scatter: bool) -> str:
        return f"{impl}-{stage}-{reduce_scatter}"

    worlds = Worlds(WORLD_SIZE, {name(*runs[0]): {name(*run): harness_arguments(config_path(*run[1:]), run[0])
                                                  for run in runs} for runs in WORLDS}, tmp_path_factory.mktemp)

    def log(impl: str, stage: int, reduce_scatter: bool = True) -> dict:
        return read_log(worlds.output(name(impl, stage, reduce_scatter)))

    return log


@pytest.fixture(scope="module")
def launched(config_path) -> dict:
    """The parsed rank-0 log of harness/train.py under torchrun: nano at stage 2."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(torchrun_command(config_path(2, True), "nano"), capture_output=True, text=True,
                          env=env, timeout=600, cwd=REPO)
    assert done.returncode == 0, f"failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return read_log(done.stdout)


@pytest.mark.parametrize("impl", ["nano", "official"])
def test_every_contract_line_is_present_and_parses(run, impl):
    log = run(impl, 2)
    assert ZERO_KEYS <= log["zero"].keys() and MODEL_KEYS <= log["model"].keys()
    assert (log["zero"]["impl"], log["zero"]["stage"], log["zero"]["world_size"]) == (impl, 2, 2)
    assert log["model"]["ds_precision"] == "fp32" and log["model"]["device"] == "cpu"
    assert log["model"]["optimizer"] == OPTIMIZER[impl]
    assert [step for step, _ in log["opt_step"]] == list(range(1, STEPS + 1))
    for _, fields in log["opt_step"]:
        assert STEP_KEYS <= fields.keys()
        assert all(isinstance(fields[key], (int, float)) for key in STEP_KEYS)
        assert math.isfinite(fields["loss"]) and fields["alloc_max_mb"] > 0
        assert fields["peak_alloc_max_mb"] >= fields["alloc_max_mb"] and fields["comm_mb"] > 0
    assert log["comm"] and all({"calls", "mb"} <= fields.keys() for fields in log["comm"].values())
    assert log["warn"] == []


def test_under_torchrun_the_script_logs_what_the_world_trains(launched, run):
    """harness/train.py launched by torchrun: every contract line as above, and the same [zero],
    [model] and [comm] lines, losses, gradient norms, learning rates and bytes per step as the
    spawned world's run of the same arguments."""
    spawned = run("nano", 2)
    assert ZERO_KEYS <= launched["zero"].keys() and MODEL_KEYS <= launched["model"].keys()
    assert [step for step, _ in launched["opt_step"]] == list(range(1, STEPS + 1)) and launched["warn"] == []
    for _, fields in launched["opt_step"]:
        assert STEP_KEYS <= fields.keys()
    # what the process holds beside its tensors is the process's (a torchrun rank imports afresh; a spawned one forks)
    launched_model, spawned_model = ({key: value for key, value in log["model"].items() if key != "rss_beside_tensors_mb"}
                                     for log in (launched, spawned))
    assert launched["model"]["rss_beside_tensors_mb"] > 0 and spawned["model"]["rss_beside_tensors_mb"] > 0
    assert (launched["zero"], launched_model, launched["comm"]) == (spawned["zero"], spawned_model, spawned["comm"])
    same = ("loss", "grad_norm", "lr", "loss_scale", "comm_bytes", "comm_wire_bytes")
    assert [(step, [fields[key] for key in same]) for step, fields in launched["opt_step"]] == [
        (step, [fields[key] for key in same]) for step, fields in spawned["opt_step"]]


def test_nano_and_official_losses_agree_per_step(run):
    nano, official = run("nano", 2), run("official", 2)
    for (step, ours), (_, theirs) in zip(nano["opt_step"], official["opt_step"]):
        assert abs(ours["loss"] - theirs["loss"]) <= 1e-5, f"step {step}: {ours['loss']} vs {theirs['loss']}"


def official_state_bytes(stage: int, numel: int, world_size: int) -> int:
    """Official DeepSpeed in fp32 between steps (what its code keeps, measured here): the full fp32
    parameters; stage 0: torch's AdamW states for all of them; stages 1-2: a separate fp32 master
    partition plus AdamW states for it. Gradients are released by the step's zero_grad."""
    partition = FlatLayout.for_stage((numel,), stage, "fp32", world_size).partition_numel
    master = 0 if stage == 0 else partition * FP32
    return numel * FP32 + master + 2 * partition * FP32


@pytest.fixture(scope="module")
def group_numels() -> list[int]:
    """Parameters per parameter group the harness hands the engine (decayed matrices, the rest):
    nano pads and partitions each group's flat buffer separately."""
    groups = parameter_groups(build_model("tiny", seed=0), weight_decay=0.0)
    return [sum(parameter.numel() for parameter in group["params"]) for group in groups]


def nano_state_bytes(stage: int, moment: str, group_numels: list[int]) -> int:
    """nano's formula at one moment of a step, summed over the parameter groups."""
    return sum(sum(model_state_bytes(stage, "fp32", numel, WORLD_SIZE, moment).values())
               for numel in group_numels)


def flat_buffer_bytes(stage: int, group_numels: list[int]) -> int:
    """fp32 bytes of every group's flat buffer, each padded as nano's layout pads it."""
    return sum(FlatLayout.for_stage((numel,), stage, "fp32", WORLD_SIZE).padded_numel for numel in group_numels) * FP32


def last_step(log: dict) -> dict:
    return log["opt_step"][-1][1]


def test_nano_stage2_saves_the_formulas_bytes(run, group_numels):
    """pre_step_alloc (after the last backward) is the formula's "backward" moment: stage 0 holds
    full param.grad, stage 2 only its gradient partition. alloc (after the step) is its
    "between_steps" moment: parameters and optimizer-state partitions, no gradient buffer."""
    stage0, stage2 = run("nano", 0), run("nano", 2)
    assert sum(group_numels) == stage2["model"]["params"]
    for field, moment in (("pre_step_alloc_max_bytes", "backward"),
                          ("alloc_max_bytes", "between_steps")):
        measured = last_step(stage0)[field] - last_step(stage2)[field]
        formula = nano_state_bytes(0, moment, group_numels) - nano_state_bytes(2, moment, group_numels)
        assert formula > 0 and abs(measured - formula) <= 0.01 * formula, (field, measured, formula)


def test_step_1s_pre_step_alloc_has_no_optimizer_states_yet(run, group_numels):
    """Adam creates its states in the first engine.step(): step 1's pre_step_alloc (after the
    backward, before that step) is smaller than later steps' by the states' bytes alone
    (docs/log-format.md, `pre_step_alloc_max_mb`)."""
    steps = [fields["pre_step_alloc_max_bytes"] for _, fields in run("nano", 2)["opt_step"]]
    states = sum(model_state_bytes(2, "fp32", numel, WORLD_SIZE, "backward")["optimizer_states"] for numel in group_numels)
    assert states > 0 and steps[1] - steps[0] == states and steps[1:] == [steps[1]] * (len(steps) - 1), (steps, states)


def test_official_stage2_saves_the_formulas_bytes(run):
    stage0, stage2 = run("official", 0), run("official", 2)
    numel = stage2["model"]["params"]
    measured = last_step(stage0)["alloc_max_bytes"] - last_step(stage2)["alloc_max_bytes"]
    formula = official_state_bytes(0, numel, WORLD_SIZE) - official_state_bytes(2, numel, WORLD_SIZE)
    assert formula > 0 and abs(measured - formula) <= 0.01 * formula, (measured, formula)


# One collective goes by several names: torch >= 2.13 renamed the tensor variants to `_single`,
# and an engine may gather into a list or into one tensor. The byte convention is the same.
FAMILY = {"all_gather_into_tensor": "all_gather", "all_gather_single": "all_gather",
          "reduce_scatter_tensor": "reduce_scatter", "reduce_scatter_single": "reduce_scatter"}


def bytes_per_step(log: dict) -> dict[str, int]:
    """Bytes per step by collective family (all_reduce, all_gather, reduce_scatter, ...)."""
    totals: dict[str, int] = {}
    for op, fields in log["comm"].items():
        family = FAMILY.get(op, op)
        totals[family] = totals.get(family, 0) + fields["bytes"] // STEPS
    return totals


@pytest.mark.parametrize("reduce_scatter", [True, False])
def test_nano_stage2_moves_the_formulas_bytes(run, group_numels, reduce_scatter):
    """Gradients: reduce-scatter of every group's whole flat buffer (on gloo an all-to-all of its
    shares, each owner adding its parts, counted as the reduce_scatter it implements; see
    Collectives.reduce_scatter) or all-reduce of it;
    parameters: an all-gather of every buffer; plus one fp32 scalar all-reduce, the squared
    gradient norm (a non-finite norm skips the step: no separate overflow check)."""
    log = run("nano", 2, reduce_scatter)
    buffer_bytes = flat_buffer_bytes(2, group_numels)
    norm = FP32
    expected = ({"reduce_scatter": buffer_bytes, "all_gather": buffer_bytes, "all_reduce": norm}
                if reduce_scatter else {"all_reduce": buffer_bytes + norm, "all_gather": buffer_bytes})
    assert bytes_per_step(log) == expected
    for op, fields in log["comm"].items():  # whole fp32 arrays: the bus-bytes factor divides them exactly
        assert fields["wire_bytes"] == wire_bytes(op, fields["bytes"], WORLD_SIZE), op


def test_official_stage2_moves_the_formulas_bytes(run):
    """DeepSpeed 0.19's stage 2 (use_multi_rank_bucket_allreduce) all-reduces gradient buckets even
    with reduce_scatter true, all-gathers each parameter group's flat buffer, and all-reduces two
    fp32 scalars (the overflow check's MAX and the gradient norm's SUM)."""
    log = run("official", 2)
    numel = log["model"]["params"]
    assert bytes_per_step(log) == {"all_reduce": numel * FP32 + 2 * FP32, "all_gather": numel * FP32}


def stage3_buffers() -> list[tuple[int, str]]:
    """(padded fp32 elements, unit) of every flat buffer nano makes of tiny at stage 3 with the
    harness's zero3.json: the unit policy, read from nano, applied to the harness's model."""
    from zero_lab.nano.config import load_config
    from zero_lab.nano.policies.stage3_units import choose_units, flat_buffer_roles

    settings = load_config(json.loads((REPO / "harness" / "configs" / "zero3.json").read_text()),
                           world_size=WORLD_SIZE)
    model = build_model("tiny", seed=0)
    groups = parameter_groups(model, weight_decay=0.0)
    units = choose_units(model, [p for group in groups for p in group["params"]], settings.zero_optimization)
    return [(FlatLayout.for_stage((numel,), 3, "fp32", WORLD_SIZE).padded_numel, role)
            for numel, role in flat_buffer_roles(units, groups)]


def test_nano_stage3_moves_the_formulas_bytes(run):
    """At accumulation 1, official's fetch rules (fetch_policy.py) under zero3.json, one unit per
    module's own parameters (tiny's embedding and head are untied: no root): the first step records
    the trace, so each unit is gathered twice (its forward, its backward); from the second on,
    zero3.json's prefetch bucket (5e7 elements) reaches every unit ahead of its use and what the
    prefetch fetched is kept for that use, so each is gathered once, even at reuse distance 0.
    Every step: each persistent parameter's buffer once (published after the step, all in one call); every
    buffer's gradients are reduce-scattered once (on gloo an all-to-all of the shares, counted as
    reduce_scatter); plus the squared norm's fp32 all-reduce."""
    log = run("nano", 3)
    buffers = stage3_buffers()
    first_step = {"block": 2, "persistent": 1}
    later_steps = {"block": 1, "persistent": 1}
    assert {role for _, role in buffers} == {"block", "persistent"}
    gathered = sum((first_step[role] + (STEPS - 1) * later_steps[role]) * numel * FP32 for numel, role in buffers)
    assert bytes_per_step(log) == {
        "all_gather": gathered // STEPS,
        "reduce_scatter": sum(numel * FP32 for numel, _ in buffers),
        "all_reduce": FP32}


def test_nano_and_official_stage3_losses_agree_per_step(run):
    nano, official = run("nano", 3), run("official", 3)
    for (step, ours), (_, theirs) in zip(nano["opt_step"], official["opt_step"]):
        assert abs(ours["loss"] - theirs["loss"]) <= 1e-5, f"step {step}: {ours['loss']} vs {theirs['loss']}"
