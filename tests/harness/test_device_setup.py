"""The harness on a GPU, as far as a CPU can tell (issue 17): the device is selected and CUDA
initialised before any memory meter touches it; official DeepSpeed without the CUDA toolkit runs
torch's AdamW and says so; every run names the optimizer it stepped with."""

from __future__ import annotations

import os
import sys
import types

import pytest
import torch

import zero_lab.harness.train as train_module
from zero_lab.workload.engines import cuda_toolkit
from zero_lab.workload.engines import impls

CONFIG = {"train_micro_batch_size_per_gpu": 1, "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
          "bf16": {"enabled": True}, "zero_optimization": {"stage": 2}}


def test_the_device_is_selected_and_initialised_before_any_meter(monkeypatch):
    """Finding 1: CUDA's allocator refuses reset_peak_memory_stats on a device CUDA has not initialised."""
    events = []
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: events.append(f"set_device {device}"))
    monkeypatch.setattr(torch.cuda, "init", lambda: events.append("init"))

    class Meter:
        def __init__(self, device):
            events.append("meter built")

        def start(self):
            events.append("meter started")

        def stop(self):
            events.append("meter stopped")

    monkeypatch.setattr(train_module, "MemoryMeter", Meter)
    monkeypatch.setattr(train_module, "train_with_meters", lambda *args: events.append("engine"))
    train_module.train(None, torch.device("cuda", 0), {}, None)
    assert events == ["set_device cuda:0", "init", "meter built", "meter started", "engine", "meter stopped"]


def test_cpu_runs_touch_no_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: pytest.fail("set_device on a CPU run"))
    monkeypatch.setattr(torch.cuda, "init", lambda: pytest.fail("CUDA initialised on a CPU run"))
    train_module.select_device(torch.device("cpu"))


def test_official_without_the_toolkit_runs_torch_adam_and_says_so(monkeypatch):
    """Finding 2: FusedAdam needs nvcc, ninja and CUDA_HOME; without them, torch_adam and a note."""
    monkeypatch.setattr(cuda_toolkit, "toolkit_problems", lambda: ["no ninja on PATH"])
    monkeypatch.setattr(cuda_toolkit, "fused_adam_prebuilt", lambda: False)
    official, notes = impls.engine_config("official", CONFIG, torch.device("cuda", 0))
    assert official["optimizer"]["params"]["torch_adam"] is True
    assert len(notes) == 1 and "FusedAdam" in notes[0] and "no ninja on PATH" in notes[0]
    assert "torch_adam" not in CONFIG["optimizer"]["params"]  # the caller's config is left alone


@pytest.mark.parametrize("problems, prebuilt", [([], False), (["no nvcc in /usr/local/cuda/bin"], True)])
def test_official_keeps_fused_adam_where_it_can_be_had(monkeypatch, problems, prebuilt):
    monkeypatch.setattr(cuda_toolkit, "toolkit_problems", lambda: problems)
    monkeypatch.setattr(cuda_toolkit, "fused_adam_prebuilt", lambda: prebuilt)
    official, notes = impls.engine_config("official", CONFIG, torch.device("cuda", 0))
    assert "torch_adam" not in official["optimizer"]["params"] and notes == []


def test_nano_and_cpu_configs_need_no_note(monkeypatch):
    monkeypatch.setattr(cuda_toolkit, "toolkit_problems", lambda: pytest.fail("no toolkit question on CPU"))
    assert impls.engine_config("nano", CONFIG, torch.device("cuda", 0)) == (CONFIG, [])
    official, notes = impls.engine_config("official", CONFIG, torch.device("cpu"))
    assert official["optimizer"]["params"]["torch_adam"] is True and notes == []


def test_the_optimizer_is_named_under_its_zero_wrappers():
    adamw = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))])
    zero_wrapper = types.SimpleNamespace(optimizer=adamw)
    assert impls.optimizer_name(types.SimpleNamespace(optimizer=zero_wrapper)) == "torch.optim.AdamW"
    assert impls.optimizer_name(types.SimpleNamespace(optimizer=adamw)) == "torch.optim.AdamW"

    class FusedAdam:
        pass

    bf16_wrapper = types.SimpleNamespace(optimizer=types.SimpleNamespace(optimizer=FusedAdam()))
    assert impls.optimizer_name(types.SimpleNamespace(optimizer=bf16_wrapper)) == "FusedAdam"


@pytest.mark.parametrize("device, accelerator", [("cpu", "cpu"), ("cuda", "cuda")])
def test_ds_accelerator_names_the_runs_device_whatever_was_left(monkeypatch, device, accelerator):
    """Finding 9, in the rank: a leftover DS_ACCELERATOR does not decide official's accelerator."""
    monkeypatch.setenv("DS_ACCELERATOR", "cpu" if accelerator == "cuda" else "cuda")
    monkeypatch.setitem(sys.modules, "deepspeed", types.SimpleNamespace())
    monkeypatch.setitem(sys.modules, "deepspeed.comm.torch", types.SimpleNamespace())
    impls.load_engine_module("official", torch.device(device))
    assert os.environ["DS_ACCELERATOR"] == accelerator
