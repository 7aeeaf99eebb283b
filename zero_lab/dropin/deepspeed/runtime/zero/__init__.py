"""`deepspeed.zero` (= `deepspeed.runtime.zero`): nano's `Init` and `GatheredParameters`."""

from zero_lab.nano.zero import GatheredParameters, Init

from deepspeed.runtime.zero import partition_parameters

__all__ = ["Init", "GatheredParameters", "partition_parameters"]
