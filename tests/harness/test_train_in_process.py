"""harness/train.py's `main` in this process (world size 1, tiny): the process group's backend
follows --device, bad input that only the engine or Hugging Face find exits 2 with one line, and
the `[warn]` lines follow the engine's loss and skipped steps."""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist

from tests.ports import free_port
from zero_lab.workload.log_contract.log_lines import parse_line

REPO = Path(__file__).resolve().parents[2]
TINY_RUN = ("--model-name", "tiny", "--steps", "2", "--batch-size", "1", "--seq-len", "16",
            "--device", "cpu")


@pytest.fixture(scope="module")
def train_module():
    from zero_lab.harness import train

    return train


@pytest.fixture
def one_process(monkeypatch):
    environment = dict(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1",
                       MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    for key, value in environment.items():
        monkeypatch.setenv(key, value)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the machine's cores are shared with the torchrun tests
    yield
    torch.set_num_threads(threads)
    assert not dist.is_initialized()  # main tears its process group down, even on error


def contract_lines(text: str) -> list[tuple]:
    return [parsed for parsed in map(parse_line, text.splitlines()) if parsed is not None]


def test_device_cpu_uses_gloo_on_a_host_with_cuda(train_module, one_process, monkeypatch, capsys):
    """nano, like DeepSpeed, defaults to nccl whenever CUDA exists; --device cpu must not."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert train_module.dist_backend(torch.device("cpu")) == "gloo"
    assert train_module.dist_backend(torch.device("cuda", 0)) == "nccl"
    assert train_module.main(["--impl", "nano", *TINY_RUN]) == 0
    steps = [fields for tag, _, fields in contract_lines(capsys.readouterr().out) if tag == "opt_step"]
    assert len(steps) == 2 and all(math.isfinite(fields["loss"]) for fields in steps)


def test_dist_timeout_is_the_process_groups_timeout(train_module, one_process, monkeypatch):
    import datetime

    import zero_lab.nano as nano

    given = []
    engine_module = SimpleNamespace(
        init_distributed=lambda **kwargs: given.append(kwargs) or nano.init_distributed(**kwargs),
        initialize=nano.initialize)
    monkeypatch.setattr(train_module, "load_engine_module", lambda impl, device: engine_module)
    assert train_module.main(["--dist-timeout", "65", *TINY_RUN]) == 0
    assert given[0]["timeout"] == datetime.timedelta(seconds=65)


def refuse(train_module, capsys, *argv: str) -> str:
    assert train_module.main(list(argv)) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith("error: ") and captured.err.count("\n") == 1, captured.err
    assert "Traceback" not in captured.err
    return captured.err


def test_config_value_nano_rejects_in_initialize(train_module, one_process, capsys, tmp_path):
    """load_config accepts the scheduler's params; nano's scheduler rejects the value."""
    config = json.loads((REPO / "harness" / "configs" / "zero2.json").read_text())
    config["scheduler"]["params"]["warmup_num_steps"] = 0
    path = tmp_path / "no_warmup.json"
    path.write_text(json.dumps(config))
    err = refuse(train_module, capsys, "--deepspeed_config", str(path), *TINY_RUN)
    assert "warmup_num_steps must be a positive integer" in err


def test_a_dist_timeout_that_is_no_time_to_wait(train_module, one_process, capsys):
    assert "--dist-timeout 0 is not a time to wait" in refuse(train_module, capsys, "--dist-timeout", "0", *TINY_RUN)


def test_attention_implementation_that_does_not_exist(train_module, one_process, capsys):
    err = refuse(train_module, capsys, "--attn-impl", "bogus", *TINY_RUN)
    assert "cannot build model tiny (--attn-impl bogus)" in err and "Pick an --attn-impl" in err


class NonFiniteEngine:
    """An engine whose loss is nan and which skips every step (a non-finite gradient norm)."""

    def __init__(self, model):
        self.module = model
        self.skipped_steps = 0
        self.optimizer = SimpleNamespace(cur_scale=1024.0)

    def __call__(self, **batch):
        return SimpleNamespace(loss=self.module(**batch).loss * math.nan)

    def backward(self, loss):
        pass

    def step(self):
        self.skipped_steps += 1

    def gradient_accumulation_steps(self):
        return 1

    def zero_optimization_stage(self):
        return 2

    def get_global_grad_norm(self):
        return math.inf

    def get_lr(self):
        return [0.0]


def test_non_finite_loss_and_skipped_steps_are_warned(train_module, one_process, monkeypatch, capsys):
    import zero_lab.nano as nano

    engine_module = SimpleNamespace(
        init_distributed=nano.init_distributed,
        initialize=lambda model, model_parameters, config: (NonFiniteEngine(model), None, None, None))
    monkeypatch.setattr(train_module, "load_engine_module", lambda impl, device: engine_module)
    assert train_module.main(list(TINY_RUN)) == 0
    warnings = [fields for tag, _, fields in contract_lines(capsys.readouterr().out) if tag == "warn"]
    kinds = [(fields["step"], fields["kind"]) for fields in warnings]
    assert kinds == [(1, "non_finite_loss"), (1, "skipped_step"), (2, "non_finite_loss"),
                     (2, "skipped_step")]
    assert math.isnan(warnings[0]["loss"]) and warnings[1]["loss_scale"] == 1024


def test_offload_shows_nanos_states_by_place_beside_the_formula(train_module, one_process, capsys):
    """fp32 stage 2 with the optimizer offloaded, W=1: after a step the device holds the parameters
    (4 B each) and the host the master and Adam's two states (12 B each); the [model] line's
    formula adds the gradient partition the step holds (16 B each on the host)."""
    assert train_module.main(["--impl", "nano", "--zero-stage", "2", "--offload", "optimizer", *TINY_RUN]) == 0
    lines = contract_lines(capsys.readouterr().out)
    model = next(fields for tag, _, fields in lines if tag == "model")
    steps = [fields for tag, _, fields in lines if tag == "opt_step"]
    megabytes = model["params"] / 2**20
    for fields in steps:
        assert fields["states_device_mb"] == pytest.approx(4 * megabytes, abs=1e-4)
        assert fields["states_host_mb"] == pytest.approx(12 * megabytes, abs=1e-4)
    assert model["states_formula_mb"] == pytest.approx(4 * megabytes, abs=1e-4)
    assert model["states_formula_host_mb"] == pytest.approx(16 * megabytes, abs=1e-4)


PHASE_RUN = ("--model-name", "tiny", "--steps", "2", "--batch-size", "2", "--seq-len", "32", "--device", "cpu")


def phase_lines(out: str) -> tuple[list[dict], list[dict], dict, dict]:
    """([opt_step] fields, [phase] fields, [model] fields, [zero] fields) of a run's output."""
    lines = contract_lines(out)
    steps = [fields for tag, _, fields in lines if tag == "opt_step"]
    phases = [fields for tag, _, fields in lines if tag == "phase"]
    model = next(fields for tag, _, fields in lines if tag == "model")
    zero = next(fields for tag, _, fields in lines if tag == "zero")
    return steps, phases, model, zero


@pytest.mark.parametrize("stage", [1, 2])
def test_memory_through_a_step_nano(train_module, one_process, capsys, stage):
    """Three [phase] samples per step; nano's categories are its formula's buffers, and what the live
    bytes hold beyond them after the forward is the activation model's count; the step's peak is
    the predicted one."""
    from zero_lab.analysis.memory.activation_memory import activation_bytes, decoder_shape
    from zero_lab.analysis.memory.peak_memory import error_percent, predict_run_peak
    from zero_lab.nano.memory.memory_formula import model_state_bytes
    from zero_lab.workload.log_contract.log_lines import MB
    from zero_lab.workload.meters.phase_memory import PHASES

    assert train_module.main(["--impl", "nano", *PHASE_RUN, "--zero-stage", str(stage)]) == 0
    steps, phases, model, zero = phase_lines(capsys.readouterr().out)
    assert [(row["step"], row["phase"]) for row in phases] == [(step, phase) for step in (1, 2) for phase in PHASES]
    last = {row["phase"]: row for row in phases if row["step"] == 2}
    assert last["after_backward"]["live_bytes"] == steps[-1]["pre_step_alloc_max_bytes"]  # one rank: its own max
    assert last["after_step"]["live_bytes"] == steps[-1]["alloc_max_bytes"]
    peaks = [last[phase]["peak_bytes"] for phase in PHASES]
    assert peaks == sorted(peaks) and all(last[p]["peak_bytes"] >= last[p]["live_bytes"] for p in PHASES)

    def categories(row: dict) -> dict:
        return {key[:-len("_bytes")]: value for key, value in row.items()
                if key.endswith("_bytes") and key not in ("live_bytes", "peak_bytes")}

    numel = model["params"]
    assert categories(last["after_step"]) == model_state_bytes(stage, "fp32", numel, 1, "between_steps")
    assert categories(last["after_backward"]) == model_state_bytes(stage, "fp32", numel, 1, "backward")
    rest = last["after_forward"]["live_bytes"] - sum(categories(last["after_forward"]).values())
    assert rest == pytest.approx(activation_bytes(decoder_shape("tiny"), 32, 2, "fp32").saved, rel=2e-3)
    prediction = predict_run_peak(model, zero, stage, "fp32", 1)
    assert abs(error_percent(prediction.peak / MB, steps[-1]["peak_alloc_max_mb"])) < 15


def test_an_offloaded_runs_peak_is_predicted_per_place(train_module, one_process, capsys):
    """nano, stage 2, optimizer offloaded, fp32, one rank on CPU. The prediction splits each moment
    into the device's bytes and the host's (issue 31: on CUDA the offload rows set a prediction of
    both beside a measurement of the device alone). The CPU tracker sees every tensor, so the two
    places together are what it measures; after the step, nano's own count of what it holds in
    each place is the formula's for that place."""
    from zero_lab.analysis.memory.activation_memory import decoder_shape
    from zero_lab.analysis.memory.peak_memory import Offload, error_percent, model_states_by_place_at, predict_run_peak
    from zero_lab.workload.log_contract.log_lines import MB

    assert train_module.main(["--impl", "nano", *PHASE_RUN, "--zero-stage", "2", "--offload", "optimizer"]) == 0
    steps, _, model, zero = phase_lines(capsys.readouterr().out)
    prediction = predict_run_peak(model, zero, 2, "fp32", 1)
    assert prediction.peak_seen_on("cpu") == prediction.peak > prediction.peak_seen_on("cuda") == prediction.peak_in("device")
    assert abs(error_percent(prediction.peak_seen_on("cpu") / MB, steps[-1]["peak_alloc_max_mb"])) < 15
    placed = model_states_by_place_at("between_steps", 2, "fp32", 1, decoder_shape("tiny"), offload=Offload(optimizer=True))
    assert steps[-1]["states_device_mb"] == pytest.approx(placed["device"] / MB, abs=1e-4)
    assert steps[-1]["states_host_mb"] == pytest.approx(placed["host"] / MB, abs=1e-4)
    assert prediction.places["optimizer_step"]["host"] == placed["host"] + 4 * model["params"]  # + the gradient partition


@pytest.mark.official
def test_memory_through_a_step_official(train_module, one_process, capsys):
    """Official DeepSpeed's samples: live and peak bytes, no categories (its memory_breakdown is a flag)."""
    assert train_module.main(["--impl", "official", *PHASE_RUN, "--zero-stage", "2"]) == 0
    steps, phases, _, _ = phase_lines(capsys.readouterr().out)
    assert len(phases) == 3 * len(steps) == 6
    assert all(set(row) == {"step", "phase", "live_bytes", "peak_bytes"} for row in phases)
    assert phases[-1]["live_bytes"] == steps[-1]["alloc_max_bytes"]


def refusing_engine(refuse_in: str):
    """nano's initialize, with one of the engine's calls at step 1 refusing an allocation: the forward
    for real (the CPU allocator refuses 2^62 bytes), the backward and the step with CUDA's error."""
    import zero_lab.nano as nano

    def initialize(**kwargs):
        engine, *rest = nano.initialize(**kwargs)
        if refuse_in == "forward":
            engine.forward = lambda **batch: torch.empty(2**62, dtype=torch.uint8)
        else:
            def refuse(*args, **kwargs):
                raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total "
                                             "capacity of 79.19 GiB of which 1.21 GiB is free.")
            setattr(engine, refuse_in, refuse)
        return (engine, *rest)

    return SimpleNamespace(init_distributed=nano.init_distributed, initialize=initialize)


@pytest.mark.parametrize("phase, asked", [("forward", "4294967296.0 GB"), ("backward", "2.0 GB"), ("step", "2.0 GB")])
def test_an_allocation_refused_is_one_line_naming_rank_phase_and_figures_and_exit_4(
        train_module, one_process, monkeypatch, capsys, phase, asked):
    from zero_lab.workload.faults.out_of_memory import EXIT_OUT_OF_MEMORY

    monkeypatch.setattr(train_module, "load_engine_module", lambda impl, device: refusing_engine(phase))
    assert train_module.main(list(TINY_RUN)) == EXIT_OUT_OF_MEMORY == 4
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err
    lines = [line for line in captured.err.splitlines() if line.startswith("out of memory:")]
    assert len(lines) == 1, captured.err
    prefix = f"out of memory: rank 0 in {phase}: tried to allocate {asked}; allocated "
    assert lines[0].startswith(prefix) and ", resident " in lines[0] and "MB this step" in lines[0], lines[0]
    assert not [fields for tag, _, fields in contract_lines(captured.out) if tag == "opt_step"], "step 1 never ended"


def test_the_clis_attention_and_checkpointing_flags_reach_the_model(train_module, one_process, monkeypatch, capsys):
    """`run`/`compare --attn-impl eager --gradient-checkpointing` become the harness's flags
    (`torchrun.workload_arguments`), which build the model with eager attention and Hugging Face's
    gradient checkpointing on, and say so in the [model] line."""
    from zero_lab.launch.torchrun import Workload, workload_arguments

    built = []
    build = train_module.build_model
    monkeypatch.setattr(train_module, "build_model", lambda *args, **kwargs: built.append(build(*args, **kwargs)) or built[-1])
    flags = workload_arguments(Workload(model="tiny", steps=1, batch_size=1, seq_len=16, attn_impl="eager",
                                        gradient_checkpointing=True))
    assert train_module.main(["--impl", "nano", "--device", "cpu", *flags]) == 0
    model = next(fields for tag, _, fields in contract_lines(capsys.readouterr().out) if tag == "model")
    assert (model["attn_impl"], model["gradient_checkpointing"]) == ("eager", True)
    assert built[0].config._attn_implementation == "eager" and built[0].is_gradient_checkpointing
