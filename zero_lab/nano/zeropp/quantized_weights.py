"""qwZ, ZeRO++'s quantized weights: stage 3 whose gathers for compute send int8 blocks.

`zero_quantized_weights` changes one thing, the wire format of a sharded unit's gather
(`ShardedFlatBuffer.start_gather`). One gather of a `QuantizedGathers` buffer:
    Phase 1 (`start_gather`): quantize this rank's partition (the primary, or hpZ's secondary) in
            blocks (`nano.zeropp.quantization`: int8 values, one fp32 scale per block), then all-gather the
            values into an int8 buffer of the unit's padded size and the scales into an fp32 buffer
            of group size x blocks: two all-gathers, as official DeepSpeed sends them
            (`_all_gather_coalesced` with quantize=True).
    Phase 2 (the handle's `wait`): multiply every rank's blocks by their scales into `full`, the
            buffer the parameters view, and free the temporaries: the blocks sent and received.
Official quantizes every gather its parameter coordinator makes (forward, backward, prefetch,
hpZ's secondary ones) and none that `GatheredParameters` makes; nano the same: `hold_whole` (the
consolidated state dict, `GatheredParameters`) and `destroy` gather exactly. The partitions Adam
updates stay exact; only the gathered copy a forward or backward computes with is quantized, so
the error does not accumulate over steps (each gather quantizes the current partition afresh).
With hpZ, the secondary partition is cut from the dequantized whole (as official copies it from
`param.data`), and its gathers quantize it again.
"""

from __future__ import annotations

import torch

from zero_lab.nano.collectives import Collectives, free_storage
from zero_lab.nano.sharded_flat_buffer import BufferState, ShardedFlatBuffer
from zero_lab.nano.zeropp.hierarchical_partition import HierarchicalShardedBuffer, Stage3HierarchicalOptimizer
from zero_lab.nano.zeropp.quantization import dequantize, quantize
from zero_lab.nano.stage3 import Stage3Optimizer


class _DequantizeOnArrival:
    """The two all-gathers of a quantized gather; waiting dequantizes into the whole buffer (Phase 2)
    and frees the temporaries, this rank's sent blocks too (the backend's thread may still refer to
    them: freed here, their bytes do not depend on when it lets go)."""

    def __init__(self, works, sent, values: torch.Tensor, scales: torch.Tensor, full: torch.Tensor):
        self.works, self.sent, self.values, self.scales, self.full = works, sent, values, scales, full

    def wait(self) -> bool:
        if self.values is not None:
            for work in self.works:
                if work is not None:
                    work.wait()
            dequantize(self.values, self.scales, self.full)
            for temporary in (self.sent.values, self.sent.scales, self.values, self.scales):
                free_storage(temporary)
            self.sent = self.values = self.scales = None
        return True


class QuantizedGathers:
    """The buffer side of qwZ: gathers send int8 blocks (Phase 1), unless asked for an exact one."""

    exact = False  # the gather in progress is an exact one (hold_whole, destroy)
    gathers_with_others = False  # int8 blocks and their scales: each buffer by itself

    def start_gather(self, collectives: Collectives, local: torch.Tensor, asynchronous: bool):
        if self.exact:
            return super().start_gather(collectives, local, asynchronous)
        blocks = quantize(local)  # Phase 1
        values = torch.empty(local.numel() * collectives.world_size, dtype=torch.int8, device=local.device)
        scales = torch.empty(blocks.scales.numel() * collectives.world_size, dtype=torch.float32, device=local.device)
        works = [collectives.all_gather_into_tensor(values, blocks.values, async_op=asynchronous),
                 collectives.all_gather_into_tensor(scales, blocks.scales, async_op=asynchronous)]
        arrival = _DequantizeOnArrival(works, blocks, values, scales, self.full)
        if asynchronous:
            return arrival
        arrival.wait()
        return None

    def synchronize(self, collectives: Collectives) -> None:
        """Construction's gathers (hpZ's first secondary) are exact, as official's initial partitioning."""
        self.exact = True
        try:
            super().synchronize(collectives)
        finally:
            self.exact = False

    def unshard_exactly(self, collectives: Collectives) -> None:
        """Make the buffer whole from unquantized partitions (official's GatheredParameters)."""
        if self.state != BufferState.SHARDED:
            return  # already whole (or on its way): official does not gather an available parameter again
        self.exact = True
        try:
            self.unshard(collectives)
            self.wait()
        finally:
            self.exact = False


class QuantizedShardedBuffer(QuantizedGathers, ShardedFlatBuffer):
    """A stage-3 buffer whose gathers are quantized."""


class QuantizedHierarchicalBuffer(QuantizedGathers, HierarchicalShardedBuffer):
    """An hpZ buffer whose gathers, from the primaries or the secondaries, are quantized."""


class QuantizedWeights:
    """The optimizer side of qwZ: gathers outside the hooks are exact."""

    def hold_whole(self, index: int) -> None:
        entry = self._entry_of(index)
        for buffer in entry.buffers if entry is not None else ():
            buffer.unshard_exactly(self.collectives)
        super().hold_whole(index)  # the unit's hold: its buffers are whole already

    def destroy(self) -> None:
        for buffer in self.buffers:
            if isinstance(buffer, QuantizedGathers):
                buffer.unshard_exactly(self.collectives)
        super().destroy()


class Stage3QuantizedWeightsOptimizer(QuantizedWeights, Stage3Optimizer):
    """Stage 3 with qwZ (see the module docstring)."""

    sharded_buffer = QuantizedShardedBuffer


class Stage3HierarchicalQuantizedWeightsOptimizer(QuantizedWeights, Stage3HierarchicalOptimizer):
    """hpZ with qwZ: both partitions' gathers are quantized."""

    hierarchical_buffer = QuantizedHierarchicalBuffer
