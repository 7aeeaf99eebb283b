"""The log contract's lines, `[tag] key=value ...` one per line (docs/log-format.md): the one writer
and the one tokenizer every reader uses.

`format_line` is what rank 0 prints. Reading goes through two functions, shared by every reader:
    `find_tagged(line)`: the tag, the step (for `[opt_step k]`) and the rest of a contract line,
                         found anywhere in the line (torchrun's `[default0]:` prefix is fine);
    `split_fields(rest)`: the `key=value` tokens as a dict of typed values, or None when a token
                         is not `key=value` (a line cut off or fused with another).
Values are typed one way everywhere (`parse_value`): int, float (`nan`, `inf` too), bool (`true`
and `false`, and the seed's `True` and `False`), None, else the text.
`parse_line` is the strict reader the tests use: the whole line is one contract line. The tolerant
reader (`zero_lab.analysis.runs.logparse`) adds what logs in the wild need on top of the same tokenizer.
Values never contain spaces: `format_value` replaces them, so `key=value` pairs split on whitespace.
"""

from __future__ import annotations

import math
import re

MB = 2**20  # the contract's MB: mebibytes


def size_text(size: float | None, like: float | None = None) -> str:
    """Bytes for a person, in messages (not log fields): GB with one decimal from 1 GB, else whole MB
    (2^30 and 2^20 bytes), in the unit `like` would take when given ("0.3 GB of 23.0 GB"); "?" when unknown."""
    if size is None:
        return "?"
    return f"{size / 2**30:.1f} GB" if (size if like is None else like) >= 2**30 else f"{size / MB:.0f} MB"

TAGS = ("rank", "zero", "model", "opt_step", "phase", "collective", "comm", "warn", "ckpt")

# Per-field number formats; loss and grad_norm carry enough digits for 1e-6 comparisons.
FLOAT_FORMATS = {
    "loss": "{:.9g}",
    "grad_norm": "{:.9g}",
    "lr": "{:.9g}",
    "loss_scale": "{:g}",
    "step_ms": "{:.1f}",
    "step_cpu_ms": "{:.1f}",
    "tokens_per_s": "{:.1f}",
    "seconds": "{:.3f}",
}
MB_FORMAT = "{:.4f}"

_TAGGED = re.compile(r"\[(?:(?P<tag>" + "|".join(tag for tag in TAGS if tag != "opt_step")
                     + r")|opt_step (?P<step>\d+))\](?P<rest>.*)$")
_FIELD = re.compile(r"(?P<key>\w+)=(?P<value>\S+)")
_WORDS = {"true": True, "false": False, "none": None, "True": True, "False": False, "None": None}


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
    """int, float, bool or None when the text spells one, else the text."""
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return _WORDS.get(text, text)


def _parts(match: re.Match) -> tuple[str, int | None, str]:
    step = match["step"]
    return (match["tag"] or "opt_step"), (int(step) if step is not None else None), match["rest"]


def find_tagged(line: str) -> tuple[str, int | None, str] | None:
    """(tag, step or None, the rest of the line) of the first contract tag in `line`, or None."""
    match = _TAGGED.search(line.rstrip("\n"))
    return None if match is None else _parts(match)


def split_fields(rest: str) -> dict | None:
    """Every whitespace-separated token as `key=value`, typed; None if any token is not one."""
    fields = {}
    for token in rest.split():
        match = _FIELD.fullmatch(token)
        if match is None:
            return None
        fields[match["key"]] = parse_value(match["value"])
    return fields


def parse_line(line: str) -> tuple[str, int | None, dict] | None:
    """(tag, step, fields) of a line that is exactly one contract line; None for any other line."""
    match = _TAGGED.match(line.strip())
    if match is None:
        return None
    tag, step, rest = _parts(match)
    fields = split_fields(rest)
    return None if fields is None else (tag, step, fields)
