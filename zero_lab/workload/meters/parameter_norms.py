"""Each parameter's norm after every optimizer step: where two runs' parameters first part, by name,
and whether an update moved them at all (`analysis.runs.updates`).

When two runs' losses part (`analysis.compare.divergence`), some parameters parted first. To name them, rank 0
of a harness run writes, before the first step (as step 0, or the step a resume starts after) and
after each optimizer step's `[opt_step]` line, one JSON line per step to the file the launcher names (PARAMETER_NORMS_ENVIRONMENT, `<run_dir>/logs/parameter-norms.jsonl`):
    {"step": k, "norms": {"<parameter name>": <L2 norm>, ...}}
The norm is taken in float64 by a reduction that makes no copy of the parameter (the exact meter
sees 8 bytes), after the step's figures are sampled, so the step's time and memory do not include it.

It needs every parameter whole in rank 0's process: an engine that keeps them partitioned between
steps (stage 3: official's `ds_tensor`, nano's released storage; FSDP2's DTensor shards) exposes no
whole parameters, and the file then says so once, `{"step": k, "partitioned": "<name>"}`, and stops.

Phase 1: `from_environment()`: the writer, on rank 0 when the launcher asked (None otherwise).
Phase 2: `writer.after_step(step, module)`.
Phase 3: `read_norms(path)`: {step: {name: norm}}, or the reason there are none.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch

PARAMETER_NORMS_ENVIRONMENT = "ZERO_LAB_PARAMETER_NORMS"  # the launcher sets it to <run_dir>/logs/parameter-norms.jsonl
PARAMETER_NORMS_FILE = "parameter-norms.jsonl"


def partitioned_parameter(module: torch.nn.Module) -> str | None:
    """The name of the first parameter this process does not hold whole (None: all are whole)."""
    from torch.distributed.tensor import DTensor

    for name, parameter in module.named_parameters():
        if isinstance(parameter, DTensor) or hasattr(parameter, "ds_tensor") or parameter.numel() == 0:
            return name
        needed = (parameter.storage_offset() + parameter.numel()) * parameter.element_size()
        if parameter.untyped_storage().nbytes() < needed:  # nano's stage 3 between uses: released
            return name
    return None


def parameter_norms(module: torch.nn.Module) -> dict[str, float]:
    """Each parameter's L2 norm in float64 (no copy of the parameter; one device sync for all)."""
    names, norms = [], []
    with torch.no_grad():
        for name, parameter in module.named_parameters():
            names.append(name)
            norms.append(torch.linalg.vector_norm(parameter.detach(), dtype=torch.float64))
    return dict(zip(names, torch.stack(norms).tolist())) if norms else {}


class ParameterNormWriter:
    """Phase 2: one JSON line per optimizer step, until the parameters turn out partitioned."""

    def __init__(self, path: Path):
        self.path = Path(path)  # appended to: a restarted attempt adds its steps (the reader keeps the last)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.stopped = False

    def after_step(self, step: int, module: torch.nn.Module) -> None:
        if self.stopped:
            return
        partitioned = partitioned_parameter(module)
        line = {"step": step, "partitioned": partitioned} if partitioned else {"step": step,
                                                                                "norms": parameter_norms(module)}
        self.stopped = partitioned is not None
        with self.path.open("a", encoding="utf-8") as handle:
            handle.write(json.dumps(line) + "\n")


def from_environment(rank: int, environ=os.environ) -> ParameterNormWriter | None:
    """Phase 1: rank 0's writer of the file the launcher named (None: another rank, or not asked)."""
    path = environ.get(PARAMETER_NORMS_ENVIRONMENT)
    return ParameterNormWriter(Path(path)) if path and rank == 0 else None


def read_norms(path: Path) -> tuple[dict[int, dict[str, float]], str | None]:
    """Phase 3: ({step: {name: norm}}, None), or (what there is, why there is no more: the
    partitioned parameter's sentence, or that the run wrote no file)."""
    path = Path(path)
    if not path.is_file():
        return {}, "the run wrote no parameter norms"
    norms, reason = {}, None
    for text in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            line = json.loads(text)
        except ValueError:  # a line cut off when its rank was killed
            continue
        if "partitioned" in line:
            reason = f"its parameters are partitioned between steps ({line['partitioned']} is not whole on rank 0)"
        else:
            norms[int(line["step"])] = line["norms"]
    return norms, reason
