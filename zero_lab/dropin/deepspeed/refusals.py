"""What nano does not implement, refused in one line when a script imports it.

An import finder placed last on `sys.meta_path` answers only `deepspeed.*` modules that nothing
else found (nano's own modules are found first): the import fails with a `ModuleNotFoundError`
(so code that probes for a feature with `try: import ... except ImportError` still falls back)
whose one line names the feature and the way out.
"""

from __future__ import annotations

import sys

# Module -> the feature it belongs to; a module under one of these prefixes shares its feature.
FEATURES = {
    "deepspeed.pipe": "pipeline parallelism",
    "deepspeed.runtime.pipe": "pipeline parallelism",
    "deepspeed.moe": "mixture of experts (MoE)",
    "deepspeed.sequence": "sequence parallelism",
    "deepspeed.runtime.sequence_parallel": "sequence parallelism",
    "deepspeed.utils.groups": "model, expert and sequence parallel groups",
    "deepspeed.runtime.swap_tensor": "NVMe offload",
    "deepspeed.ops.aio": "NVMe offload",
    "deepspeed.inference": "DeepSpeed inference",
    "deepspeed.runtime.activation_checkpointing": "DeepSpeed's activation checkpointing (use torch.utils.checkpoint)",
    "deepspeed.module_inject": "tensor parallelism (AutoTP)",
}
WAY_OUT = ("run this script with official DeepSpeed (zero-lab exec --impl official, or without zero_lab/dropin "
           "on PYTHONPATH)")


def refusal(module: str) -> str:
    """The one line for `module`."""
    for prefix, feature in FEATURES.items():
        if module == prefix or module.startswith(prefix + "."):
            return f"{module}: {feature} is not implemented by nano (zero-lab's drop-in for deepspeed); {WAY_OUT}"
    return f"{module} is not provided by nano (zero-lab's drop-in for deepspeed; see docs/clients.md); {WAY_OUT}"


class RefusingFinder:
    """Last on sys.meta_path: a `deepspeed.*` module no other finder found is refused."""

    @staticmethod
    def find_spec(fullname, path=None, target=None):
        if fullname.startswith("deepspeed."):
            raise ModuleNotFoundError(refusal(fullname), name=fullname)
        return None


def install() -> None:
    if not any(isinstance(finder, RefusingFinder) for finder in sys.meta_path):
        sys.meta_path.append(RefusingFinder())
