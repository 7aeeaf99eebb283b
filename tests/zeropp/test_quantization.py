"""qwZ's block-wise int8 format (`nano.quantization`) against a pure-torch round trip written here,
one block at a time, and its error bound: every element within absmax(block) / 128 of its value, all
but a block's largest positive one within absmax / 256. No processes."""

from __future__ import annotations

import pytest
import torch

from zero_lab.nano.quantization import block_count, dequantize, max_error, quantize


def reference_round_trip(tensor: torch.Tensor, blocks: int) -> torch.Tensor:
    """Official's Symmetric 8-bit kernel, one block at a time: scale 2^8 / (2 absmax), round to
    nearest, clamp to [-128, 127], multiply back by the stored inverse."""
    out = []
    for block in tensor.float().chunk(blocks):
        absmax = block.abs().max().item()
        multiplier = 256 / (2 * absmax) if absmax else 1.0
        stored = 1 / multiplier
        out.append(torch.round(block * multiplier).clamp(-128, 127) * stored)
    return torch.cat(out)


def test_block_count_is_officials_adaptive_rule():
    assert block_count(16_000) == 2  # ceil(16000 / 8000), blocks of 8000 (a multiple of 8)
    assert block_count(8) == 1
    assert block_count(64_000) == 8
    assert block_count(8 * 1001) == 7  # 2 blocks of 4004 are no multiple of 8: the next count that divides is 7
    assert block_count(2 * 3 * 5 * 7 * 11 * 13) == 5  # 30030: 4 blocks do not divide it, 5 do (no multiple of 8: nano drops the factor 8)
    for numel in (8, 200, 4_002, 16_000, 213_600, 2_933_464, 30_030):
        blocks = block_count(numel)
        assert numel % blocks == 0 and numel // blocks <= 16_000  # official's hard limit


@pytest.mark.parametrize("numel", [16, 4_000, 24_000, 30_030, 213_600])
def test_a_round_trip_equals_the_reference_and_stays_within_the_bound(numel):
    generator = torch.Generator().manual_seed(numel)
    tensor = torch.randn(numel, generator=generator) * torch.rand(numel, generator=generator) * 0.05
    blocks = quantize(tensor)
    assert blocks.values.dtype == torch.int8 and blocks.values.numel() == numel
    assert blocks.scales.dtype == torch.float32 and blocks.scales.numel() == block_count(numel)
    back = dequantize(blocks.values, blocks.scales, torch.empty(numel))
    expected = reference_round_trip(tensor, block_count(numel))
    torch.testing.assert_close(back, expected, rtol=1e-6, atol=1e-9)  # the scale's float rounding only
    error = (back - tensor).abs()  # in fp32: the subtraction itself is exact to ~1e-5 of the bound
    bound = max_error(tensor)
    assert bool((error <= bound * (1 + 1e-4)).all())
    half_step = error <= bound / 2 * (1 + 1e-4)
    assert int((~half_step).sum()) <= block_count(numel)  # at most one clamped element per block
    assert error.max() > bound.min() / 16  # int8 is lossy: the round trip is no copy


def test_a_zero_block_and_the_clamped_maximum():
    tensor = torch.cat([torch.zeros(8), torch.tensor([1.0, -1.0, 0.5, 0.25, 0, 0, 0, 0])])
    blocks = quantize(tensor.reshape(-1)[:8])
    assert blocks.scales.tolist() == [1.0] and blocks.values.abs().sum() == 0  # official: scale 1 for a zero block
    blocks = quantize(tensor[8:])
    assert blocks.values.tolist() == [127, -128, 64, 32, 0, 0, 0, 0]  # +absmax clamps to 127, -absmax fits
    back = dequantize(blocks.values, blocks.scales, torch.empty(8))
    assert back[0].item() == pytest.approx(1 - 1 / 128) and back[1].item() == -1.0


def test_several_ranks_blocks_dequantize_end_to_end():
    """A gather's receiver holds every rank's blocks and scales end to end: one dequantize."""
    parts = [torch.randn(4_000, generator=torch.Generator().manual_seed(rank)) for rank in range(3)]
    quantized = [quantize(part) for part in parts]
    values = torch.cat([item.values for item in quantized])
    scales = torch.cat([item.scales for item in quantized])
    whole = dequantize(values, scales, torch.empty(12_000, dtype=torch.bfloat16))
    for rank, part in enumerate(parts):
        alone = dequantize(quantized[rank].values, quantized[rank].scales, torch.empty(4_000, dtype=torch.bfloat16))
        assert torch.equal(whole[rank * 4_000:(rank + 1) * 4_000], alone)
