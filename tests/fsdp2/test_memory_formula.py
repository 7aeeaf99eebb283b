"""FSDP2's formula split by place (zero_lab.fsdp2.memory_formula.peak_bytes): on CUDA the device
mesh's rank map stays on the host, and so would torch.optim's step scalars if the optimizer were
not fused; what each of torch.optim's Adam implementations holds while it steps
(`step_temporary_bytes`), measured. Pure: the accelerator is pretended on the `meta` device
(docs/gpu.md), nothing launched."""

import pytest
import torch

from tests.nano.reference import build_model
from tests.nano.workers import nano_config
from zero_lab.fsdp2.memory_formula import ADAM_IMPLEMENTATIONS, INT32, moment_bytes, peak_bytes, step_temporary_bytes
from zero_lab.workload.meters.memory_meter import LiveStorageTracker
from zero_lab.nano.config import load_config


def test_an_unfused_adamw_off_the_cpu_keeps_its_step_scalar_on_the_host():
    """Why zero_lab.fsdp2's fused choice moves bytes: torch.optim's default AdamW (neither
    capturable nor fused) makes `step` a CPU tensor beside states on the parameter's device (the
    fused one keeps it beside the parameter; meta has no fused kernel to show it: the GPU test
    `test_fsdp2_matches_the_reference_on_the_gpu_with_its_states_there` does)."""
    parameter = torch.nn.Parameter(torch.empty(4, 3, device="meta"))
    optimizer = torch.optim.AdamW([parameter], lr=0.1)
    parameter.grad = torch.empty(4, 3, device="meta")
    optimizer.step()
    state = optimizer.state[parameter]
    assert state["step"].device.type == "cpu" and state["step"].dtype == torch.float32
    assert state["exp_avg"].device.type == state["exp_avg_sq"].device.type == "meta"


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_on_cuda_the_rank_map_is_host_bytes(world_size):
    model = build_model()
    shapes = [tuple(parameter.shape) for parameter in model.parameters()]
    settings = load_config(nano_config(3), world_size=world_size)
    total = moment_bytes(shapes, world_size, "backward")
    assert peak_bytes(model, settings, world_size, "cpu") == {"device": total, "host": 0}
    on_cuda = peak_bytes(model, settings, world_size, "cuda")
    assert on_cuda["host"] == INT32 * world_size
    assert on_cuda["device"] + on_cuda["host"] == total
    offloaded = nano_config(3)
    offloaded["zero_optimization"]["offload_optimizer"] = {"device": "cpu"}
    assert peak_bytes(model, load_config(offloaded, world_size=world_size), world_size, "cuda") == {"device": 0,
                                                                                                  "host": total}


SHAPES = [[(64, 32), (48, 16)], [(64,), (16,)]]  # two parameter groups: matrices decayed, vectors not
OPTIONS = {"fused": {"fused": True}, "foreach": {"foreach": True}, "for-loop": {"foreach": False}}


@pytest.mark.parametrize("implementation", ADAM_IMPLEMENTATIONS)
def test_what_each_adam_implementation_holds_while_it_steps_is_the_formulas(implementation):
    """torch.optim's AdamW stepped under the storage tracker (entered before the parameters exist),
    its second step (the states exist): fused holds nothing, foreach a copy of the largest group's
    exp_avg_sq, the for-loop two copies of the largest parameter's. Left to torch, CUDA tensors get
    foreach, which CPU runs never show (issue 31): zero_lab.fsdp2 asks for fused."""
    tracker = LiveStorageTracker("cpu")
    with tracker:
        torch.manual_seed(0)
        groups = [[torch.nn.Parameter(torch.randn(shape)) for shape in group] for group in SHAPES]
        optimizer = torch.optim.AdamW([{"params": groups[0], "weight_decay": 0.1}, {"params": groups[1]}], lr=1e-3,
                                      **OPTIONS[implementation])
        for parameter in (parameter for group in groups for parameter in group):
            parameter.grad = torch.randn_like(parameter)
        optimizer.step()
        before = tracker.live_bytes
        tracker.reset_peak()
        optimizer.step()
        held = tracker.peak_bytes - before
    assert held == step_temporary_bytes(SHAPES, 1, implementation)
    assert step_temporary_bytes(SHAPES, 1, implementation) == {"fused": 0, "foreach": 4 * (64 * 32 + 48 * 16),
                                                              "for-loop": 2 * 4 * 64 * 32}[implementation]


def test_the_temporaries_are_of_the_ranks_own_chunks():
    """At W = 3 rank 0 holds ceil(64 / 3) = 22 rows of a 64-row matrix, the last rank 20."""
    assert step_temporary_bytes([[(64, 32)]], 3, "foreach") == 4 * 22 * 32
    assert step_temporary_bytes([[(64, 32)]], 3, "foreach", rank=2) == 4 * 20 * 32
    assert step_temporary_bytes([[(64, 32)]], 3, "fused") == 0
    with pytest.raises(ValueError, match="implementation must be one of"):
        step_temporary_bytes([[(64, 32)]], 3, "apex")


def test_docs_fsdp2_gives_each_implementations_bytes_for_qwen3():
    """docs/fsdp2.md's table "The optimizer": each MB is the formula's for qwen3-0.6b's parameter
    groups as the harness forms them (decayed matrices, the rest), and so is the group's size."""
    import math

    from tests.docs.doc_text import REPO, read, table_after
    from zero_lab.workload.model_shapes import preset_parameters
    from zero_lab.workload.models import decays

    shapes = [entry.shape for entry in preset_parameters("qwen3-0.6b")]
    groups = [[shape for shape in shapes if decays(shape)], [shape for shape in shapes if not decays(shape)]]
    doc = read(REPO / "docs" / "fsdp2.md")
    rows = table_after(doc, "### The optimizer")
    assert [row[0].split(" ")[0] for row in rows[1:]] == list(ADAM_IMPLEMENTATIONS)
    for row in rows[1:]:
        implementation = row[0].split(" ")[0]
        for cell, world_size in zip(row[2:], (1, 8)):
            assert cell == f"{step_temporary_bytes(groups, world_size, implementation) / 2**20:.1f} MB", row
    decayed, total = sum(math.prod(shape) for shape in groups[0]), sum(math.prod(shape) for shape in shapes)
    assert f"{decayed:,} of its {total:,} parameters" in " ".join(doc.split())
