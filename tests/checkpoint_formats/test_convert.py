"""`zero-lab checkpoint convert` and `inspect` on one process, against references no one here wrote:
nano's own loader, Hugging Face's `from_pretrained`, torch's profiler and DCP's reader.

One module fixture trains the `tiny` model 2 steps with nano (stage 2, W=1, in this process),
saves it, keeps the module's logits, and converts the checkpoint to every format once."""

from __future__ import annotations

import json
import os
import shutil

import pytest
import torch
from torch.profiler import ProfilerActivity, profile
from typer.testing import CliRunner

from tests.cli.test_cli import one_line_error
from tests.harness.test_train_torchrun import REPO
from zero_lab.checkpoint_formats import convert as conversion
from zero_lab.checkpoint_formats.common import FORMATS, KEYS, MASTER
from zero_lab.cli.app import app
from tests.ports import free_port
from zero_lab.nano.checkpoint import files
from zero_lab.nano.facade.distributed import init_distributed
from zero_lab.workload.data import make_batches
from zero_lab.workload.models import build_model, load_tokenizer, parameter_groups

runner = CliRunner()


def invoke(*arguments):
    return runner.invoke(app, [str(argument) for argument in arguments])


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """(root, the trained module's logits on one batch, that batch); root/ckpt is nano's
    checkpoint, root/<format> its conversion."""
    import zero_lab.nano as nano

    root = tmp_path_factory.mktemp("convert")
    environment = dict(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), RANK="0", WORLD_SIZE="1")
    previous = {name: os.environ.get(name) for name in environment}
    os.environ.update(environment)
    init_distributed(dist_backend="gloo")
    try:
        config = json.loads((REPO / "harness" / "configs" / "zero2.json").read_text())
        config["train_micro_batch_size_per_gpu"] = 2
        model = build_model("tiny", seed=0)
        engine, *_ = nano.initialize(model=model, model_parameters=parameter_groups(model, 0.1), config=config)
        batches = make_batches(load_tokenizer("tiny"), 32, 2, 1, 0)
        for step in range(2):
            engine.backward(engine(**batches.get(step, 0)).loss)
            engine.step()
        engine.save_checkpoint(str(root / "ckpt"))
        batch = batches.get(2, 0)
        with torch.no_grad():
            logits = engine.module(input_ids=batch["input_ids"]).logits.clone()
    finally:
        torch.distributed.destroy_process_group()
        for name, value in previous.items():
            os.environ.pop(name) if value is None else os.environ.__setitem__(name, value)
    for format in FORMATS:
        extra = ["--model-name", "tiny"] if format == "hf" else ["--world-size", "2"] if format == "deepspeed" else []
        done = invoke("checkpoint", "convert", root / "ckpt", root / format, "--to", format, *extra)
        assert done.exit_code == 0, done.output
        notes = [line for line in done.stderr.splitlines() if line.startswith("note: ")]
        assert notes == (["note: hf holds the weights only: Adam's moments and step, the schedule, the step "
                          "counters and the loss scaler are not written"] if format == "hf" else []), done.stderr
    return root, logits, batch


def values(directory, tag=None) -> dict:
    source = conversion.open_source(str(directory), tag)
    return {(name, key): source.read(name, key) for name in source.facts.shapes for key in KEYS}


def test_every_format_holds_nanos_masters_and_moments_exactly_and_converts_back(saved):
    root, _, _ = saved
    original = values(root / "ckpt")
    for format in ("deepspeed", "universal", "dcp"):
        converted = values(root / format)
        assert converted.keys() == original.keys()
        assert all(torch.equal(converted[key], original[key]) for key in original), format
        back = root / f"{format}-back"
        done = invoke("checkpoint", "convert", root / format, back, "--to", "deepspeed", "--world-size", "1")
        assert done.exit_code == 0, done.output
        again = values(back)
        assert all(torch.equal(again[key], original[key]) for key in original), format
    weights = values(root / "hf")
    assert all(torch.equal(weights[(name, MASTER)], original[(name, MASTER)]) for name, key in original if key == MASTER)


def test_the_step_counters_and_schedule_travel_through_universal_and_dcp(saved):
    """nano's checkpoint -> universal or dcp -> DeepSpeed's files again: the counters and the
    schedule's state come back as nano saved them."""
    root, _, _ = saved
    first = files.read_tag(str(root / "ckpt"), "global_step2")[1]
    for format in ("universal", "dcp"):
        model_states = files.read_tag(str(root / f"{format}-back"), "global_step2")[1]
        assert (model_states["global_steps"], model_states["global_samples"], model_states["lr_scheduler"]) == \
            (first["global_steps"], first["global_samples"], first["lr_scheduler"])


def test_hf_weights_give_exactly_the_trained_modules_logits_in_transformers(saved):
    from transformers import AutoModelForCausalLM

    root, logits, batch = saved
    model = AutoModelForCausalLM.from_pretrained(str(root / "hf"))
    with torch.no_grad():
        assert torch.equal(model(input_ids=batch["input_ids"]).logits, logits)


def test_inspect_reads_all_four_formats(saved):
    root, _, _ = saved
    for format in ("ckpt", "deepspeed", "universal", "dcp", "hf"):
        done = invoke("checkpoint", "inspect", root / format, "--format", "json")
        assert done.exit_code == 0, done.output
        facts = json.loads(done.stdout)
        assert facts["format"] == ("deepspeed" if format == "ckpt" else format)
        assert facts["parameters"] == 854_400
        if format != "hf":
            assert facts["global_steps"] == 2
    assert json.loads(invoke("checkpoint", "inspect", root / "deepspeed", "--format", "json").stdout)["world_size"] == 2


def peak_bytes(work) -> int:
    """The most bytes torch held at once while `work` ran, from torch's profiler: each op's own
    allocations and frees, in the order they happened."""
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as profiler:
        work()
    live = peak = 0
    for event in sorted(profiler.events(), key=lambda event: event.time_range.start):
        live += event.self_cpu_memory_usage
        peak = max(peak, live)
    return peak


@pytest.mark.parametrize("source", ["deepspeed", "dcp"])
def test_streaming_peak_equals_the_prediction_and_is_far_below_the_model(saved, tmp_path, source):
    """From DeepSpeed's files cut for 2 ranks and from DCP, to every format: the bytes torch holds
    at once, measured, equal the prediction printed before the conversion; the whole model's fp32
    masters and moments are more than 15 times as many (tiny: 10,252,800 bytes)."""
    root, _, _ = saved
    opened = conversion.open_source(str(root / source))
    largest = opened.facts.largest_numel() * 4  # one fp32 tensor of the largest parameter
    for format in FORMATS:
        predicted = conversion.predicted_peak_bytes(opened, format)
        measured = peak_bytes(lambda: conversion.convert(opened, format, str(tmp_path / format), conversion.Options()))
        print(f"{source} -> {format}: predicted {predicted:,} measured {measured:,}")
        assert measured == predicted, (source, format)
        assert 15 * predicted < opened.facts.numel() * 12
        if source == "deepspeed":  # one tensor at a time; DCP's writer holds the one before too
            assert predicted == (2 if format == "dcp" else 1) * largest


def bad_input(root, tmp_path, name, damage):
    """A copy of a conversion, damaged; converting it is one line, exit 2, and nothing written."""
    copy = tmp_path / f"{name}-{len(list(tmp_path.iterdir()))}"
    shutil.copytree(root / name, copy)
    damage(copy)
    out = tmp_path / "out"
    line = one_line_error(invoke("checkpoint", "convert", copy, out, "--to", "hf"))
    assert not out.exists() and not any(path.name.endswith(".partial") for path in tmp_path.iterdir())
    return line


def truncate(path):
    path.write_bytes(path.read_bytes()[:len(path.read_bytes()) // 2])


def test_bad_input_is_one_line_exit_2_and_nothing_is_written(saved, tmp_path):
    root, _, _ = saved
    step = "global_step2"
    assert "truncated or corrupt" in bad_input(root, tmp_path, "deepspeed", lambda copy: truncate(
        copy / step / "zero_pp_rank_1_mp_rank_00_optim_states.pt"))

    def zero_64_bytes(path):  # inside a tensor's record: torch.load would read other Adam moments without a word
        data = bytearray(path.read_bytes())
        data[len(data) // 2:len(data) // 2 + 64] = bytes(64)
        path.write_bytes(bytes(data))

    damaged = bad_input(root, tmp_path, "deepspeed", lambda copy: zero_64_bytes(
        copy / step / "zero_pp_rank_1_mp_rank_00_optim_states.pt"))
    assert "zero_pp_rank_1_mp_rank_00_optim_states.pt is corrupt: its record " in damaged
    assert "/data/" in damaged and "fails its CRC-32 check" in damaged
    assert "a rank's shard is missing" in bad_input(root, tmp_path, "deepspeed", lambda copy: os.remove(
        copy / step / "zero_pp_rank_1_mp_rank_00_optim_states.pt"))

    def wrong_shape(copy):
        path = copy / step / "mp_rank_00_model_states.pt"
        states = files.read_file(str(path), mmap=False)
        first = next(iter(states["param_shapes"][0]))
        states["param_shapes"][0][first] = torch.Size([7, 7])
        files.write_file(states, str(path))

    assert "mismatched shapes" in bad_input(root, tmp_path, "deepspeed", wrong_shape)
    distcp = lambda copy: sorted((copy / step).glob("*.distcp"), key=lambda path: path.stat().st_size)[-1]  # noqa: E731
    assert "truncated" in bad_input(root, tmp_path, "dcp", lambda copy: truncate(distcp(copy)))
    assert "is missing" in bad_input(root, tmp_path, "dcp", lambda copy: os.remove(distcp(copy)))
    assert "truncated" in bad_input(root, tmp_path, "universal", lambda copy: truncate(
        copy / step / "zero" / "model.norm.weight" / "fp32.pt"))
    assert "truncated" in bad_input(root, tmp_path, "hf", lambda copy: truncate(copy / "model.safetensors"))
    taken = tmp_path / "taken"
    taken.mkdir()
    assert "exists" in one_line_error(invoke("checkpoint", "convert", root / "ckpt", taken, "--to", "dcp"))
    assert "--to" in one_line_error(invoke("checkpoint", "convert", root / "ckpt", tmp_path / "x", "--to", "onnx"))
    assert list(taken.iterdir()) == [] and not (tmp_path / "x").exists()
