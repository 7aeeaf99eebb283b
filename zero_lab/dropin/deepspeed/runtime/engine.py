"""`deepspeed.runtime.engine.DeepSpeedEngine` is nano's engine, so `isinstance(model, DeepSpeedEngine)`
holds for what `deepspeed.initialize` returns (accelerate unwraps a model that way)."""

from zero_lab.nano.facade.engine import NanoEngine as DeepSpeedEngine

__all__ = ["DeepSpeedEngine"]
