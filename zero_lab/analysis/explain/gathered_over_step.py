"""Stage 3's fetch rules at work: what stays gathered, use by use, over one steady micro-step.

Phase 1: the micro-step `explain` walks (`stage3_micro_step`: `nano.policies.fetch_policy`'s rules
         over the trace of the model's module calls), and the units whole after each use is
         released, as bytes in the parameters' dtype.
Phase 2: one row per decoder layer: what is gathered once the layer's forward is done (after its
         last use in the forward) and once its backward is done (after its last use in the backward).
         The root (the tied embedding and head), held from the forward to the end of the backward,
         is in every figure.
"""

from __future__ import annotations

import re

from zero_lab.analysis.explain.explain import flat_buffers, stage3_micro_step
from zero_lab.nano.dtypes import BYTES_OF_PRECISION

LAYER = re.compile(r"(?:^|\.)layers\.(\d+)(?:\.|$)")


def gathered_over_step(model: str, entries: list, blocks: list[str], config, world_size: int) -> dict:
    """Phases 1 and 2 for a stage-3 `config` (`zero-lab explain --gathered --format json`)."""
    zero = config.zero_optimization
    micro_step = stage3_micro_step(model, entries, blocks, flat_buffers(entries, blocks, config, world_size), config)
    width = BYTES_OF_PRECISION[config.precision]
    uses = [{"phase": phase, "module": str(module), "gathered_bytes": numel * width}
            for phase, module, numel in micro_step.gathered_after]
    return {"model": model, "world_size": world_size, "precision": config.precision,
            "rules": {"stage3_prefetch_bucket_size": zero.stage3_prefetch_bucket_size,
                      "stage3_max_live_parameters": zero.stage3_max_live_parameters,
                      "stage3_max_reuse_distance": zero.stage3_max_reuse_distance},
            "uses": uses, "layers": by_layer(uses)}


def by_layer(uses: list[dict]) -> list[dict]:
    """Phase 2: per decoder layer, the bytes gathered after its last forward use and its last backward use."""
    layers: dict[int, dict[str, int]] = {}
    for use in uses:
        found = LAYER.search(use["module"])
        if found:  # a later use of the layer in the same phase overwrites: its last one counts
            layers.setdefault(int(found[1]), {})[use["phase"]] = use["gathered_bytes"]
    return [{"layer": layer, "after_forward_bytes": phases.get("forward"), "after_backward_bytes": phases.get("backward")}
            for layer, phases in sorted(layers.items())]


def elements(count: int) -> str:
    """A count of elements as configs write it: 0, 10000, 5e7, 1e9."""
    mantissa, exponent = f"{count:e}".split("e")
    return f"{float(mantissa):g}e{int(exponent)}" if count >= 10**5 and float(mantissa).is_integer() else str(count)


def gathered_title(result: dict, config_source: str) -> str:
    rules = ", ".join(f"{key} {elements(value)}" for key, value in result["rules"].items())
    return (f"{result['model']}, ZeRO stage 3, {result['world_size']} ranks, {result['precision']}: what stays gathered, "
            f"at {rules} ({config_source})")


def gathered_table(result: dict) -> tuple[list[str], list[list[str]]]:
    """(headers, rows): a row per decoder layer, the MB gathered once its forward and once its backward is done."""
    def mb(nbytes: int | None) -> str:
        return "-" if nbytes is None else f"{nbytes / 2**20:.2f}"

    return (["layer", "gathered after its forward", "gathered after its backward"],
            [[str(row["layer"]), mb(row["after_forward_bytes"]), mb(row["after_backward_bytes"])] for row in result["layers"]])
