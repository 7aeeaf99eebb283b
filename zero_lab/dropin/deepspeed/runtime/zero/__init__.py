"""`deepspeed.zero` (= `deepspeed.runtime.zero`): nano's `Init`, `GatheredParameters` and
`register_external_parameter` (official's `unregister_external_parameter` lives in `partition_parameters` only)."""

from zero_lab.nano.zero import GatheredParameters, Init, register_external_parameter

from deepspeed.runtime.zero import partition_parameters

__all__ = ["Init", "GatheredParameters", "register_external_parameter", "partition_parameters"]
