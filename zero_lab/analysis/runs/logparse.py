"""Read the harness's rank-0 log (docs/log-format.md) and the seed project's logs into one shape.

The tolerant reader, built on the contract's one tokenizer (`zero_lab.workload.log_contract.log_lines`), so a
value reads the same here as in the tests (`true` is a bool, `2` an int):
Phase 1: find a tagged line - `[zero]`, `[model]`, `[opt_step k]`, `[phase]`, `[collective]`,
         `[comm]` or `[warn]` - anywhere in the line (`log_lines.find_tagged`), so torchrun's
         `[default0]:` prefix and timestamps do not matter.
Phase 2: split the rest into typed `key=value` fields (`log_lines.split_fields`); rename the seed's
         `cuda_*` memory names to ours; keep the bare model path that starts the seed's `[model]`
         line as `name`.
Phase 3: a tagged line that does not parse (truncated by a crash, fused with another rank's
         output, a step without a numeric loss) is counted, not fatal.
Phase 4: a step logged again (torchrun restarted the workers, which resumed from an earlier
         checkpoint: docs/restarts.md) supersedes its first row and those of the steps after it
         (`supersede_from`), so `steps` reads as the run that finished.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from zero_lab.workload.log_contract.log_lines import find_tagged, split_fields

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
    "comm_wire_mb",
    "comm_wire_intra_mb",
    "comm_wire_inter_mb",
)
MEMORY_FIELDS = ("alloc_max_mb", "peak_alloc_max_mb", "reserved_max_mb", "peak_reserved_max_mb")


@dataclass
class ParsedLog:
    """Everything rank 0 said: headers, one dict per optimizer step, memory at each phase of each
    step, the traced collectives, totals per collective and warnings."""

    rank: dict[str, object] = field(default_factory=dict)  # who wrote this log (every rank says)
    zero: dict[str, object] = field(default_factory=dict)
    model: dict[str, object] = field(default_factory=dict)
    steps: list[dict[str, object]] = field(default_factory=list)
    phases: list[dict[str, object]] = field(default_factory=list)
    collectives: list[dict[str, object]] = field(default_factory=list)
    comm: list[dict[str, object]] = field(default_factory=list)
    checkpoints: list[dict[str, object]] = field(default_factory=list)  # [ckpt] lines: saves and loads
    warnings: list[str] = field(default_factory=list)
    skipped_lines: int = 0
    # steps logged again after a restart (`--max-restarts`): their first rows, which `steps` no longer holds
    superseded: list[dict[str, object]] = field(default_factory=list)

    def losses(self) -> dict[int, float]:
        return {int(row["step"]): float(row["loss"]) for row in self.steps if "loss" in row}

    def found_nothing(self) -> bool:
        """Not one tagged line, not even a garbled one: not a training log at all."""
        return not (self.zero or self.model or self.steps or self.phases or self.collectives or self.comm
                    or self.checkpoints or self.warnings or self.skipped_lines)


def is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def read_fields(tag: str, rest: str) -> dict[str, object] | None:
    """Phase 2: the typed fields of one tagged line, or None when it is garbled."""
    tokens = rest.split()
    name = None
    if tag == "model" and tokens and "=" not in tokens[0]:  # the seed: `[model] /path/Qwen3-0.6B key=value ...`
        name, rest = tokens[0], " ".join(tokens[1:])
    fields = split_fields(rest)
    if fields is None:
        return None
    fields = {SEED_FIELD_NAMES.get(key, key): value for key, value in fields.items()}
    return {"name": name, **fields} if name is not None else fields


def step_row(step: int, rest: str) -> dict[str, object] | None:
    """One `[opt_step k]` row, or None when the line is garbled or carries no numeric loss."""
    fields = read_fields("opt_step", rest)
    if fields is None or not is_number(fields.get("loss")):
        return None
    return {"step": step, **fields}


def step_and_loss(line: str) -> tuple[int, object] | None:
    """(step, loss or None) of an `[opt_step k]` line: what a progress display needs as it streams."""
    found = find_tagged(line)
    if found is None or found[0] != "opt_step":
        return None
    row = step_row(found[1], found[2])
    return found[1], (row or {}).get("loss")


def parse_lines(lines) -> ParsedLog:
    parsed = ParsedLog()
    for line in lines:
        found = find_tagged(line)  # Phase 1
        if found is None:
            continue
        tag, step, rest = found
        if tag == "warn":
            parsed.warnings.append(rest.strip())
            continue
        row = step_row(step, rest) if tag == "opt_step" else read_fields(tag, rest)
        if not row:  # Phase 3
            parsed.skipped_lines += 1
        elif tag == "opt_step":
            supersede_from(parsed, step)
            parsed.steps.append(row)
        elif tag in ("rank", "zero", "model"):
            getattr(parsed, tag).update(row)
        else:
            {"phase": parsed.phases, "collective": parsed.collectives, "comm": parsed.comm,
             "ckpt": parsed.checkpoints}[tag].append(row)
    return parsed


def supersede_from(parsed: ParsedLog, step: int) -> None:
    """A step logged again (a restarted attempt resumed from an earlier checkpoint): the rows of it and
    of every later step move to `superseded`, and their `[phase]` rows go, so `steps` is the final run."""
    if not parsed.steps or int(parsed.steps[-1]["step"]) < step:
        return
    parsed.superseded += [row for row in parsed.steps if int(row["step"]) >= step]
    parsed.steps = [row for row in parsed.steps if int(row["step"]) < step]
    parsed.phases = [row for row in parsed.phases if not is_number(row.get("step")) or int(row["step"]) < step]


def parse_text(text: str) -> ParsedLog:
    return parse_lines(text.splitlines())


def parse_file(path: Path) -> ParsedLog:
    with open(path, encoding="utf-8", errors="replace") as handle:
        return parse_lines(handle)
