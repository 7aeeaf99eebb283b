"""FSDP2's formula split by place (zero_lab.fsdp2.memory_formula.peak_bytes): on CUDA torch.optim's
step scalars and the device mesh's rank map stay on the host. Pure: the accelerator is pretended
on the `meta` device (docs/gpu.md), nothing launched."""

import pytest
import torch

from tests.nano.reference import build_model
from tests.nano.workers import nano_config
from zero_lab.fsdp2.memory_formula import FP32, INT32, moment_bytes, peak_bytes
from zero_lab.nano.config import load_config


def test_adamw_off_the_cpu_keeps_its_step_scalar_on_the_host():
    """What the split rests on: torch.optim's default AdamW (neither capturable nor fused) makes
    `step` a CPU tensor beside states on the parameter's device."""
    parameter = torch.nn.Parameter(torch.empty(4, 3, device="meta"))
    optimizer = torch.optim.AdamW([parameter], lr=0.1)
    parameter.grad = torch.empty(4, 3, device="meta")
    optimizer.step()
    state = optimizer.state[parameter]
    assert state["step"].device.type == "cpu" and state["step"].dtype == torch.float32
    assert state["exp_avg"].device.type == state["exp_avg_sq"].device.type == "meta"


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_on_cuda_the_step_scalars_and_the_rank_map_are_host_bytes(world_size):
    model = build_model()
    shapes = [tuple(parameter.shape) for parameter in model.parameters()]
    settings = load_config(nano_config(3), world_size=world_size)
    total = moment_bytes(shapes, world_size, "backward")
    assert peak_bytes(model, settings, world_size, "cpu") == {"device": total, "host": 0}
    on_cuda = peak_bytes(model, settings, world_size, "cuda")
    assert on_cuda["host"] == FP32 * len(shapes) + INT32 * world_size
    assert on_cuda["device"] + on_cuda["host"] == total
    offloaded = nano_config(3)
    offloaded["zero_optimization"]["offload_optimizer"] = {"device": "cpu"}
    assert peak_bytes(model, load_config(offloaded, world_size=world_size), world_size, "cuda") == {"device": 0,
                                                                                                  "host": total}
