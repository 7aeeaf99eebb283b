"""The log contract's lines: `[tag] key=value ...` on one line each (docs/log-format.md).

`format_line` is what rank 0 prints; `parse_line` is the reference reader the tests use (the
CLI keeps its own parser, which also reads the seed's `cuda_*` names). Values never contain
spaces: `format_value` replaces them, so `key=value` pairs split on whitespace.
"""

from __future__ import annotations

import math
import re

MB = 2**20  # the contract's MB: mebibytes

# Per-field number formats; loss and grad_norm carry enough digits for 1e-6 comparisons.
FLOAT_FORMATS = {
    "loss": "{:.9g}",
    "grad_norm": "{:.9g}",
    "lr": "{:.9g}",
    "loss_scale": "{:g}",
    "step_ms": "{:.1f}",
    "tokens_per_s": "{:.1f}",
}
MB_FORMAT = "{:.4f}"

_LINE = re.compile(r"^\[(?P<tag>[a-z_]+)(?: (?P<step>\d+))?\](?P<rest>.*)$")


def format_value(key: str, value) -> str:
    if isinstance(value, bool) or value is None:
        return str(value).lower()
    if isinstance(value, float):
        if not math.isfinite(value):
            return str(value)  # nan, inf, -inf
        return FLOAT_FORMATS.get(key, MB_FORMAT if key.endswith("_mb") else "{:.9g}").format(value)
    return str(value).replace(" ", "_")


def format_line(tag: str, fields: dict, step: int | None = None) -> str:
    """`[tag] k=v ...`, or `[tag step] k=v ...` for per-step lines such as `[opt_step 3]`."""
    head = f"[{tag}]" if step is None else f"[{tag} {step}]"
    return " ".join([head] + [f"{key}={format_value(key, value)}" for key, value in fields.items()])


def parse_value(text: str):
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return {"true": True, "false": False, "none": None}.get(text, text)


def parse_line(line: str) -> tuple[str, int | None, dict] | None:
    """(tag, step, fields) of a contract line; None for any other line."""
    match = _LINE.match(line.strip())
    if match is None:
        return None
    fields = {}
    for pair in match["rest"].split():
        key, separator, value = pair.partition("=")
        if not separator:
            return None
        fields[key] = parse_value(value)
    step = int(match["step"]) if match["step"] is not None else None
    return match["tag"], step, fields
