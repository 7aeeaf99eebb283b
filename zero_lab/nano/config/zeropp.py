"""ZeRO++'s keys (DeepSpeed's own names), read at stage 3 only: docs/zeropp.md.

`zero_hpz_partition_size` K > 1 turns on hpZ (`nano/zeropp/hierarchical_partition.py`): a second copy of
the parameter partitions, split within each group of K consecutive ranks (a node), which every
gather after a unit's first one uses, so backward's all-gather stays inside the node.
`zero_quantized_weights` turns on qwZ (`nano/zeropp/quantized_weights.py`): every gather of a sharded unit
for compute sends int8 blocks and one fp32 scale per block (`nano/zeropp/quantization.py`).
`zero_quantized_gradients` turns on qgZ (`nano/zeropp/quantized_gradients.py`): the gradient reduce-scatter
becomes two int4 all-to-alls, within the node and then across nodes.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator


class ZeroPlusPlusSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    zero_hpz_partition_size: int = Field(1, ge=0, description="hpZ: ranks per secondary-partition group (a node); "
                                                              "0 or 1: off.")
    zero_quantized_weights: bool = Field(False, description="qwZ: stage 3's gathers send block-wise int8 "
                                                            "weights with one fp32 scale per block.")
    zero_quantized_gradients: bool = Field(False, description="qgZ: stage 3's gradient reduce-scatter becomes "
                                                              "int4 all-to-alls, within the node then across nodes.")

    @property
    def hpz_enabled(self) -> bool:
        return self.zero_hpz_partition_size > 1

    @property
    def gathers_each_buffer_alone(self) -> bool:
        """hpZ's and qwZ's gathers have a wire format per buffer (its secondary partition; int8 blocks
        and their scales), so each sharded buffer is gathered in a call by itself, never with others
        (`coalesced_gather`: their buffer classes say `gathers_with_others = False`)."""
        return self.hpz_enabled or self.zero_quantized_weights

    @model_validator(mode="after")
    def _zeropp_at_stage_3(self) -> "ZeroPlusPlusSettings":
        if self.hpz_enabled and getattr(self, "stage", 3) != 3:
            raise ValueError(f"zero_optimization.zero_hpz_partition_size {self.zero_hpz_partition_size} partitions "
                             "parameters a second time, which only stage 3 partitions; use stage 3 or remove the key")
        if self.zero_quantized_weights and getattr(self, "stage", 3) != 3:
            raise ValueError("zero_optimization.zero_quantized_weights quantizes the gathers of partitioned "
                             "parameters, which only stage 3 has; use stage 3 or remove the key")
        if self.zero_quantized_gradients and getattr(self, "stage", 3) != 3:
            raise ValueError("zero_optimization.zero_quantized_gradients quantizes stage 3's gradient reduce-scatter; "
                             "use stage 3 or remove the key")
        if self.zero_quantized_gradients and not getattr(self, "reduce_scatter", True):
            raise ValueError("zero_optimization.zero_quantized_gradients replaces the reduce-scatter, which "
                             "reduce_scatter false turns off; set reduce_scatter true or remove the key")
        return self


def hpz_world_problem(partition_size: int, world_size: int) -> str | None:
    """Why `zero_hpz_partition_size` cannot split `world_size` ranks into equal groups (None: it can)."""
    if partition_size > 1 and world_size % min(partition_size, world_size):  # official: min(K, world size)
        return (f"zero_optimization.zero_hpz_partition_size {partition_size} does not divide the world size "
                f"{world_size}; give a divisor (the ranks per node)")
    return None
