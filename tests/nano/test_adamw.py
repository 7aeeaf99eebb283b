"""nano's Adam (`adamw.py`): torch's fused kernel over every partition of a group in one call."""

from __future__ import annotations

import pytest
import torch

from tests.tolerances import PARAMETER_ROUNDING
from zero_lab.nano.adamw import PartitionedAdam

OPTIONS = dict(lr=1e-2, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.1)


def nano_steps(values: torch.Tensor, gradients: list[torch.Tensor], cuts: list[int]) -> torch.Tensor:
    """`values` stepped by nano's Adam as partitions cut at `cuts`, one gradient per step."""
    master = values.clone()
    pieces = list(master.tensor_split(cuts))
    adam = PartitionedAdam([pieces], [{}], decoupled_weight_decay=True, **OPTIONS)
    for gradient in gradients:
        adam.step([list(gradient.tensor_split(cuts))])
    return master


def torch_steps(values: torch.Tensor, gradients: list[torch.Tensor], fused: bool) -> torch.Tensor:
    parameter = torch.nn.Parameter(values.clone())
    adam = torch.optim.AdamW([parameter], fused=fused, **OPTIONS)
    for gradient in gradients:
        parameter.grad = gradient.clone()
        adam.step()
    return parameter.detach()


def test_the_step_is_torchs_fused_adamw_bit_for_bit_however_the_buffer_is_partitioned():
    torch.manual_seed(0)
    values = torch.randn(100_003) * 0.1
    gradients = [torch.randn(100_003) * 1e-2 for _ in range(3)]
    fused = torch_steps(values, gradients, fused=True)
    for cuts in ([], [7], [1000, 50_001, 99_999]):
        assert torch.equal(nano_steps(values, gradients, cuts), fused), cuts
    single_tensor = torch_steps(values, gradients, fused=False)  # official's torch_adam on a CPU
    assert (nano_steps(values, gradients, []) - single_tensor).abs().max() <= 3 * PARAMETER_ROUNDING
    assert (fused - values).abs().max() > 1e-3  # three real updates


def test_a_gradient_of_another_size_is_refused_before_the_kernel_reads_past_it():
    adam = PartitionedAdam([[torch.zeros(10)]], [{}], decoupled_weight_decay=True, **OPTIONS)
    with pytest.raises(RuntimeError, match="a gradient partition of 8 elements must match the size of its master "
                                           "partition, 10"):
        adam.step([[torch.ones(8)]])
