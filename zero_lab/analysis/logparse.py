"""Parse the harness's rank-0 log (docs/log-format.md) and the seed project's logs into one shape.

Phase 1: find a tagged line - `[zero]`, `[model]`, `[opt_step k]`, `[comm]` or `[warn]` - anywhere
         in the line, so torchrun's `[default0]:` prefix and timestamps do not matter.
Phase 2: split the rest into `key=value` pairs; rename the seed's `cuda_*` memory names to ours.
Phase 3: keep numbers as floats and everything else as text; a tagged line that does not parse
         (truncated by a crash, interleaved with another rank's output) is counted, not fatal.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path

# The seed printed CUDA-only names; ours name the same quantities without the device.
SEED_FIELD_NAMES = {
    "cuda_alloc_max_mb": "alloc_max_mb",
    "cuda_reserved_max_mb": "reserved_max_mb",
    "cuda_peak_alloc_max_mb": "peak_alloc_max_mb",
    "cuda_peak_reserved_max_mb": "peak_reserved_max_mb",
}

STEP_FIELDS = (
    "loss",
    "grad_norm",
    "lr",
    "loss_scale",
    "step_ms",
    "tokens_per_s",
    "alloc_max_mb",
    "reserved_max_mb",
    "peak_alloc_max_mb",
    "peak_reserved_max_mb",
    "comm_mb",
)
MEMORY_FIELDS = ("alloc_max_mb", "peak_alloc_max_mb", "reserved_max_mb", "peak_reserved_max_mb")

TAG_PATTERN = re.compile(r"\[(rank|zero|model|comm|warn|opt_step (\d+))\](.*)$")
PAIR_PATTERN = re.compile(r"(\w+)=(\S+)")


@dataclass
class ParsedLog:
    """Everything rank 0 said: headers, one dict per optimizer step, collectives and warnings."""

    rank: dict[str, object] = field(default_factory=dict)  # who wrote this log (every rank says)
    zero: dict[str, object] = field(default_factory=dict)
    model: dict[str, object] = field(default_factory=dict)
    steps: list[dict[str, object]] = field(default_factory=list)
    comm: list[dict[str, object]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    skipped_lines: int = 0

    def losses(self) -> dict[int, float]:
        return {int(row["step"]): float(row["loss"]) for row in self.steps if "loss" in row}

    def found_nothing(self) -> bool:
        """Not one tagged line, not even a garbled one: not a training log at all."""
        return not (self.zero or self.model or self.steps or self.comm or self.warnings or self.skipped_lines)


def parse_value(text: str) -> object:
    """A float when the text is a number (nan and inf included), else the text itself."""
    try:
        return float(text)
    except ValueError:
        return text


def parse_pairs(text: str) -> dict[str, object]:
    pairs = {}
    for key, value in PAIR_PATTERN.findall(text):
        pairs[SEED_FIELD_NAMES.get(key, key)] = parse_value(value)
    return pairs


def well_formed(rest: str) -> bool:
    """Every token is `key=value`: a line cut off mid-token or fused with another fails."""
    return all(PAIR_PATTERN.fullmatch(token) for token in rest.split())


def parse_step(step: int, rest: str) -> dict[str, object] | None:
    """One `[opt_step k]` row, or None when the line is garbled or carries no numeric loss."""
    if not well_formed(rest):
        return None
    pairs = parse_pairs(rest)
    if not isinstance(pairs.get("loss"), float):
        return None
    return {"step": step, **pairs}


def parse_lines(lines) -> ParsedLog:
    parsed = ParsedLog()
    for line in lines:
        match = TAG_PATTERN.search(line.rstrip("\n"))
        if match is None:
            continue
        tag, step, rest = match.group(1), match.group(2), match.group(3)
        if step is not None:
            row = parse_step(int(step), rest)
            if row is None:
                parsed.skipped_lines += 1
            else:
                parsed.steps.append(row)
        elif tag == "warn":
            parsed.warnings.append(rest.strip())
        else:
            pairs = parse_pairs(rest)
            if not pairs or not well_formed(rest):
                parsed.skipped_lines += 1
            elif tag == "comm":
                parsed.comm.append(pairs)
            else:
                getattr(parsed, tag).update(pairs)
    return parsed


def parse_text(text: str) -> ParsedLog:
    return parse_lines(text.splitlines())


def parse_file(path: Path) -> ParsedLog:
    with open(path, encoding="utf-8", errors="replace") as handle:
        return parse_lines(handle)


def finite(value: object) -> bool:
    return isinstance(value, float) and math.isfinite(value)
