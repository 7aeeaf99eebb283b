"""nano (issue 17) and FSDP2 (issue 19) on a CUDA GPU through NCCL at world size 1: skipped without
CUDA (tests/conftest.py); `pytest -m gpu` and `make gpu-check` run them on a GPU machine.

The process group is NCCL with one rank and ZERO_LAB_COLLECTIVES_AT_WORLD_ONE=1, so every one of
nano's collectives really goes through NCCL (a world of one would skip them otherwise). At stage 3
every parameter is sharded (`stage3_param_persistence_threshold` 0: the test model's parameters are
all below the default threshold, which would keep them whole) and released after each use
(`stage3_max_reuse_distance` 0), so gathers, prefetch and release run on CUDA.
    parity:        stages 0-3 against the single-process AdamW reference (tests/nano/reference.py);
    exact bytes:   torch.cuda.memory_allocated at phase boundaries equals the bytes nano says it
                   holds on the device (every tensor a multiple of the allocator's 512-byte blocks),
                   from a baseline taken after cuBLAS made its workspaces (whatever ran before);
    offload:       pinned host masters, nothing of the optimizer on the device, still the reference's
                   parameters;
    zero.Init:     partitions built on the GPU (finding 4), then trained like any model.
    FSDP2:         `zero_lab.fsdp2` at stages 2 and 3 with accumulation and clipping against the same
                   reference, its shards on the GPU.
Rehearsed on CPU (tests/gpu/__init__.py: gloo, the host for the GPU), every test runs but those
marked `cuda_only` (the caching allocator's figures, CUDA contexts), and pinning is not asked of
the offload test: what the rehearsal checks is what the bodies compute.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed

import zero_lab.nano as nano
from tests.ports import free_port
from zero_lab.nano.collectives import COLLECTIVES_AT_WORLD_ONE
from tests.nano.reference import ReferenceTrainer, build_model, loss_of, micro_batch
from tests.gpu import REHEARSAL_ENVIRONMENT
from tests.nano.workers import FP32_TOLERANCE, LR, MICRO_SIZE, STEPS, WEIGHT_DECAY, nano_config, train_nano

pytestmark = pytest.mark.gpu
REHEARSAL = os.environ.get(REHEARSAL_ENVIRONMENT) == "1"
DEVICE = torch.device("cpu" if REHEARSAL else "cuda")  # where the engines compute
cuda_only = pytest.mark.skipif(REHEARSAL, reason="CUDA's own figures: not rehearsed on CPU")


@pytest.fixture(scope="module", autouse=True)
def nccl_world_of_one():
    saved = dict(os.environ)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), RANK="0", LOCAL_RANK="0",
                      WORLD_SIZE="1", LOCAL_WORLD_SIZE="1", **{COLLECTIVES_AT_WORLD_ONE: "1"})
    if not REHEARSAL:
        torch.cuda.set_device(0)
    torch.distributed.init_process_group("gloo" if REHEARSAL else "nccl", rank=0, world_size=1)
    try:
        yield
    finally:
        torch.distributed.destroy_process_group()
        os.environ.clear()
        os.environ.update(saved)


def sharded(config: dict) -> dict:
    """At stage 3, every parameter sharded and released after each use (the module docstring)."""
    if config["zero_optimization"]["stage"] == 3:
        config["zero_optimization"].update(stage3_param_persistence_threshold=0, stage3_max_reuse_distance=0)
    return config


def assert_gathered_and_released(engine) -> None:
    """Stage 3 gathered its shards through NCCL and holds none of them gathered between steps."""
    if engine.zero_optimization_stage() == 3:
        assert any(operation.startswith("all_gather") for operation in engine.comm_stats()), engine.comm_stats()
        assert engine.optimizer.gathering.live.numel == 0


def cpu_gap(model: torch.nn.Module, reference: torch.nn.Module) -> float:
    """The largest |model - reference| over the parameters, read whole: between steps a sharded
    stage-3 parameter has no storage, and reading it without gathering reads freed memory."""
    with nano.zero.GatheredParameters(list(model.parameters())):
        return max((a.detach().float().cpu() - b.detach().float().cpu()).abs().max().item()
                   for a, b in zip(model.parameters(), reference.parameters()))


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
@pytest.mark.parametrize("overlap", [False, True])
def test_every_stage_matches_the_reference_through_nccl(stage, overlap):
    initial = build_model()
    reference = ReferenceTrainer(initial, LR, WEIGHT_DECAY, 0.05)
    model = copy.deepcopy(initial)
    gaps = []

    def compare(step, engine):
        reference.step(step, 1, 2, MICRO_SIZE)
        gaps.append(cpu_gap(model, reference.model))

    engine = train_nano(model, sharded(nano_config(stage, accumulation=2, clipping=0.05, bucket=40, overlap=overlap)),
                        0, STEPS, compare)
    assert engine.device.type == DEVICE.type and next(model.parameters()).device.type == DEVICE.type
    assert engine.comm_stats(), "no collective went through NCCL"
    assert_gathered_and_released(engine)
    assert max(gaps) <= FP32_TOLERANCE, gaps
    engine.destroy()


class Wide(torch.nn.Module):
    """Two 128 x 128 fp32 layers: every tensor nano allocates is a multiple of 512 bytes, so the
    caching allocator's figure is nano's to the byte."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.first = torch.nn.Linear(128, 128, bias=False)
        self.second = torch.nn.Linear(128, 128, bias=False)

    def forward(self, inputs):
        return self.second(torch.tanh(self.first(inputs)))


def warm_up_cublas() -> None:
    """cuBLAS makes its handle's workspace through torch's caching allocator, so it counts in
    memory_allocated, at the first matrix product of a thread on a stream: forward on the test's
    thread, backward on autograd's. Run both once, so the baseline holds them whether or not an
    earlier test did."""
    warm = Wide().cuda()
    warm(torch.randn(4, 128, device="cuda")).pow(2).mean().backward()
    del warm
    torch.cuda.synchronize()


@cuda_only
@pytest.mark.parametrize("stage", [1, 2])
def test_allocated_bytes_at_phase_boundaries_are_nanos_own(stage):
    warm_up_cublas()
    inputs = torch.randn(4, 128, device="cuda")
    baseline = torch.cuda.memory_allocated()
    model = Wide()
    engine, *_ = nano.initialize(model=model, config=nano_config(stage, bucket=8192))

    def device_bytes() -> tuple[int, int]:
        torch.cuda.synchronize()
        return torch.cuda.memory_allocated() - baseline, engine.memory_breakdown(by_device=True)["device"]["total"]

    measured = {"initialized": device_bytes()}
    loss = engine(inputs).pow(2).mean()
    engine.backward(loss)
    del loss
    measured["after_backward"] = device_bytes()
    engine.step()
    measured["after_step"] = device_bytes()
    assert all(allocated == held for allocated, held in measured.values()), measured
    assert measured["after_step"][0] > measured["initialized"][0]  # Adam's states appeared
    engine.destroy()


@pytest.mark.parametrize("stage", [2, 3])
def test_offload_with_pinned_memory_keeps_the_optimizer_on_the_host(stage):
    initial = build_model()
    reference = ReferenceTrainer(initial, LR, WEIGHT_DECAY, 0.0)
    model = copy.deepcopy(initial)
    config = sharded(nano_config(stage, bucket=40, overlap=True))
    config["zero_optimization"]["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
    engine = train_nano(model, config, 0, STEPS, lambda step, engine: reference.step(step, 1, 1, MICRO_SIZE))
    assert_gathered_and_released(engine)
    optimizer = engine.optimizer
    if not REHEARSAL:  # pinning is CUDA's
        assert optimizer.placement.pins and all(master.is_pinned() for master in optimizer.master_partitions)
    places = engine.memory_breakdown(by_device=True)
    assert places["device"]["optimizer_states"] == 0 and places["host"]["optimizer_states"] > 0
    assert cpu_gap(model, reference.model) <= FP32_TOLERANCE
    engine.destroy()


def test_zero_init_partitions_on_the_gpu_then_trains():
    initial = build_model()
    reference = ReferenceTrainer(initial, LR, WEIGHT_DECAY, 0.0)
    with nano.zero.Init():
        torch.manual_seed(0)
        model = build_model()
    partitions = [parameter.zero_lab_init_partition for parameter in model.parameters()]
    assert all(partition.device.type == DEVICE.type for partition in partitions)
    # Decay on the reference's matrices: a parameter partitioned by Init holds an empty 1-D tensor,
    # so `parameter_groups`' test `dim() >= 2` would leave every matrix undecayed.
    decays = [parameter.dim() >= 2 for parameter in initial.parameters()]
    groups = [{"params": [parameter for parameter, decay in zip(model.parameters(), decays) if decay == wanted],
               "weight_decay": WEIGHT_DECAY if wanted else 0.0} for wanted in (True, False)]
    engine, *_ = nano.initialize(model=model, model_parameters=groups, config=sharded(nano_config(3, bucket=40)))
    for step in range(STEPS):
        engine.backward(loss_of(engine, micro_batch(step, 0, 0, MICRO_SIZE).to(engine.device)))
        engine.step()
        reference.step(step, 1, 1, MICRO_SIZE)
    assert_gathered_and_released(engine)
    assert cpu_gap(model, reference.model) <= FP32_TOLERANCE
    engine.destroy()


@pytest.mark.parametrize("stage", [2, 3])
def test_fsdp2_matches_the_reference_on_the_gpu_with_its_states_there(stage):
    """FSDP2 moves the CPU inputs to the GPU itself (its root's pre-forward on CUDA), clips on the
    GPU (the norm's squares on the engine's device) and steps torch's AdamW on CUDA shards."""
    from tests.fsdp2.workers import train as train_either

    reference = ReferenceTrainer(build_model(), LR, WEIGHT_DECAY, 0.05)
    gaps = []

    def compare(step, model):
        reference.step(step, 1, 2, MICRO_SIZE)
        gaps.append(max((ours.full_tensor().detach().float().cpu() - theirs.detach()).abs().max().item()
                        for ours, theirs in zip(model.parameters(), reference.model.parameters())))

    model, losses = train_either("fsdp2", nano_config(stage, accumulation=2, clipping=0.05), 0, STEPS, compare)
    assert all(parameter.to_local().device.type == DEVICE.type for parameter in model.parameters())
    assert max(gaps) <= FP32_TOLERANCE, gaps
    assert len(losses) == 2 * STEPS and all(loss == loss for loss in losses)



@cuda_only
def test_fsdp2s_fused_adam_keeps_its_states_on_the_gpu_and_holds_nothing_more_while_it_steps():
    """zero_lab.fsdp2 asks torch.optim for its fused AdamW (docs/fsdp2.md): every state, the step
    scalar included, beside its shard on the GPU, and the step's peak no higher than what was
    alive before it (torch's CUDA default, foreach, would hold a copy of the exp_avg_sqs)."""
    import zero_lab.fsdp2 as fsdp2
    from tests.nano.reference import parameter_groups
    from zero_lab.fsdp2.memory_formula import step_temporary_bytes

    model = build_model()
    engine, optimizer, _, _ = fsdp2.initialize(model=model, model_parameters=parameter_groups(model, WEIGHT_DECAY),
                                               config=nano_config(3))
    held = None
    for step in range(2):  # the states exist from the first step on: measure the second
        engine.backward(loss_of(engine, micro_batch(step, 0, 0, MICRO_SIZE)))
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        optimizer.step()
        torch.cuda.synchronize()
        held = torch.cuda.max_memory_allocated() - before
        optimizer.zero_grad(set_to_none=True)
    assert all(group["fused"] for group in optimizer.param_groups)
    assert all(state[key].device.type == "cuda" for state in optimizer.state.values()
               for key in ("step", "exp_avg", "exp_avg_sq"))
    groups = [[tuple(parameter.shape) for parameter in group["params"]] for group in optimizer.param_groups]
    assert held == step_temporary_bytes(groups, 1, "fused") == 0


@cuda_only
def test_the_clis_questions_to_the_gpus_leave_no_cuda_context_in_its_process():
    """Issue 31: the preflight asked every GPU its free memory in the CLI's own process, which then
    held a CUDA context (hundreds of MB) on each GPU for the whole comparison. Asked as `compare`
    asks (the device names, then the preflight's figure), in a fresh process: no GPU has a primary
    context afterwards."""
    script = ("import json, torch; from zero_lab.cli.environment import cuda_devices; "
              "from zero_lab.cli.preflight import offered_memory; names = cuda_devices(); "
              "offered, _ = offered_memory('cuda', None); print(json.dumps([len(names), offered, "
              "[torch._C._cuda_hasPrimaryContext(index) for index in range(len(names))]]))")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                          cwd=Path(__file__).resolve().parents[2])
    assert done.returncode == 0, done.stderr
    count, offered, contexts = json.loads(done.stdout.strip().splitlines()[-1])
    assert count >= 1 and offered > 0 and contexts == [False] * count


def test_a_traced_run_writes_a_timeline_and_a_snapshot_torchs_viewer_reads(tmp_path):
    """Issue 34 on the device: `--trace` through the harness (nano, stage 3, every collective through
    NCCL), steps 2-3 traced. On CUDA the memory snapshot is torch's own `_record_memory_history` and
    the counter samples the caching allocator at span edges, so its maximum is at most the measured
    peak; rehearsed on CPU both come from the exact tracker and the maximum is the peak."""
    import pickle

    from torch.cuda import _memory_viz

    from zero_lab.analysis.runs import traces
    from zero_lab.workload.log_contract.log_lines import MB, parse_line

    environment = {key: value for key, value in os.environ.items()
                   if key not in ("MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE")}
    repository = Path(__file__).resolve().parents[2]
    environment.update(ZERO_LAB_TRACE=str(tmp_path / "trace"), ZERO_LAB_TRACE_STEPS="2-3",
                       PYTHONPATH=os.pathsep.join([str(repository), environment.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "1",
                           str(repository / "harness" / "train.py"), "--impl", "nano", "--device", DEVICE.type,
                           "--model-name", "tiny", "--zero-stage", "3", "--steps", "3", "--batch-size", "2",
                           "--seq-len", "32"], capture_output=True, text=True, timeout=600, env=environment,
                          cwd=repository)
    assert done.returncode == 0, done.stderr[-3000:]
    steps = [parse_line(line) for line in done.stdout.splitlines() if line.startswith("[opt_step")]
    peak = max(fields["peak_alloc_max_mb"] for _, step, fields in steps if step in (2, 3)) * MB
    (trace,) = traces.read_traces(tmp_path)
    assert sorted(traces.step_windows(trace)) == [2, 3]
    assert [span["name"] for span in traces.spans(trace, "phase")] == ["forward", "backward", "optimizer step"] * 2
    assert {traces.family(span["name"]) for span in traces.spans(trace, "collective")} >= {"all_gather", "reduce_scatter"}
    highest = max(value for _, value in traces.memory_series(trace))
    assert 0 < highest <= peak + 0.5e-4 * MB
    if REHEARSAL:
        assert abs(highest - peak) <= 0.5e-4 * MB
    snapshot = pickle.loads((tmp_path / "trace" / "memory-snapshot-rank0.pickle").read_bytes())
    events = snapshot["device_traces"][0]
    assert any(event["action"] == "alloc" for event in events) and snapshot["segments"]
    assert f"{len(events)} entries" in _memory_viz.trace(snapshot)
    assert any(frame["name"] == "forward" for event in events for frame in event["frames"])
