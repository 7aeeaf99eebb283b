"""ZeRO++'s keys (DeepSpeed's own names), read at stage 3 only: docs/zeropp.md.

`zero_hpz_partition_size` K > 1 turns on hpZ (`nano/hierarchical_partition.py`): a second copy of
the parameter partitions, split within each group of K consecutive ranks (a node), which every
gather after a unit's first one uses, so backward's all-gather stays inside the node.
`zero_quantized_weights` turns on qwZ (`nano/quantized_weights.py`): every gather of a sharded unit
for compute sends int8 blocks and one fp32 scale per block (`nano/quantization.py`).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator


class ZeroPlusPlusSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    zero_hpz_partition_size: int = Field(1, ge=0, description="hpZ: ranks per secondary-partition group (a node); "
                                                              "0 or 1: off.")
    zero_quantized_weights: bool = Field(False, description="qwZ: stage 3's gathers send block-wise int8 "
                                                            "weights with one fp32 scale per block.")

    @property
    def hpz_enabled(self) -> bool:
        return self.zero_hpz_partition_size > 1

    @model_validator(mode="after")
    def _zeropp_at_stage_3(self) -> "ZeroPlusPlusSettings":
        if self.hpz_enabled and getattr(self, "stage", 3) != 3:
            raise ValueError(f"zero_optimization.zero_hpz_partition_size {self.zero_hpz_partition_size} partitions "
                             "parameters a second time, which only stage 3 partitions; use stage 3 or remove the key")
        if self.zero_quantized_weights and getattr(self, "stage", 3) != 3:
            raise ValueError("zero_optimization.zero_quantized_weights quantizes the gathers of partitioned "
                             "parameters, which only stage 3 has; use stage 3 or remove the key")
        return self


def hpz_world_problem(partition_size: int, world_size: int) -> str | None:
    """Why `zero_hpz_partition_size` cannot split `world_size` ranks into equal groups (None: it can)."""
    if partition_size > 1 and world_size % min(partition_size, world_size):  # official: min(K, world size)
        return (f"zero_optimization.zero_hpz_partition_size {partition_size} does not divide the world size "
                f"{world_size}; give a divisor (the ranks per node)")
    return None
