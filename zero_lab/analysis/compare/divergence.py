"""Where an impl's run first parts from the baseline's: the step, the gradients, the collectives.

"Loss parity: NO" says that two runs differ, not where. When an impl's per-step losses part from
the baseline's (same cell: world size and stage), `first_divergence` answers, from the two run
directories alone:
    1. the first step whose loss differs by more than the tolerance;
    2. whether the gradients already differed there: the first step, up to that one, whose global
       gradient norm (the `grad_norm` of each step, the engine's own) differs by more than a
       relative 1e-4 (unknown when either engine does not report one);
    3. the parameters: the first step, up to that one, after which some parameter's norm differs by
       more than a relative 1e-6, and the parameters that differ most there, by name (each run's
       `logs/parameter-norms.jsonl`, `workload.meters.parameter_norms`; not compared when an engine keeps
       its parameters partitioned between steps);
    4. the collectives: the first step, up to that one, in which a collective type was called a
       different number of times or moved different wire bytes on rank 0 (the flight record of
       collectives, `collective_record`; the harness's own bookkeeping calls are left out).
A collective that differs is not a mistake by itself (nano reduce-scatters where official
all-reduces, with the same losses); beside a loss that parts, it is where to look.
"""

from __future__ import annotations

import csv
import math
from pathlib import Path

GRAD_NORM_RTOL = 1e-4
PARAMETER_RTOL = 1e-6  # float32 updates of the same numbers agree far closer; a missed reduction moves far more
SHOWN_PARAMETERS = 3


def per_step(run_dir: Path, column: str) -> dict[int, float]:
    """{step: value} of one column of the run's metrics.csv (nan where the run has none)."""
    path = Path(run_dir) / "metrics.csv"
    if not path.is_file():
        return {}
    with path.open(encoding="utf-8") as handle:
        return {int(row["step"]): float(row.get(column) or "nan") for row in csv.DictReader(handle)}


def per_step_grad_norms(run_dir: Path) -> dict[int, float]:
    """{step: grad_norm} from the run's metrics.csv (nan where the engine reports none)."""
    return per_step(run_dir, "grad_norm")


def per_step_collectives(run_dir: Path) -> dict[int, dict[str, tuple[int, int]]]:
    """{step: {op: (calls, wire bytes)}} of rank 0's training-step collectives ({} without a record)."""
    from zero_lab.workload.meters.collective_record import read_records

    records = read_records(Path(run_dir) / "logs")
    if 0 not in records:
        return {}
    steps: dict[int, dict[str, tuple[int, int]]] = {}
    for call in records[0].calls:
        if call.step is None or call.call == "harness":
            continue
        calls, wire = steps.setdefault(call.step, {}).get(call.op, (0, 0))
        steps[call.step][call.op] = (calls + 1, wire + call.wire_bytes)
    return steps


def first_loss_step(losses: dict, baseline_losses: dict, tolerance: float) -> int | None:
    """The first step both runs have whose losses differ by more than `tolerance` (None: none)."""
    mine_by_step = {int(step): float(loss) for step, loss in losses.items()}
    theirs_by_step = {int(step): float(loss) for step, loss in baseline_losses.items()}
    for step in sorted(set(mine_by_step) & set(theirs_by_step)):
        if not abs(mine_by_step[step] - theirs_by_step[step]) <= tolerance:  # nan parts too
            return step
    return None


def first_grad_norm_step(norms: dict[int, float], baseline_norms: dict[int, float], last: int) -> dict:
    """The first step up to `last` whose gradient norms differ; known False when all agree, None unknown."""
    for step in range(1, last + 1):
        mine, theirs = norms.get(step, math.nan), baseline_norms.get(step, math.nan)
        if math.isnan(mine) or math.isnan(theirs):
            return {"gradients_differ": None, "reason": "a gradient norm is not reported"}
        if abs(mine - theirs) > GRAD_NORM_RTOL * max(abs(theirs), 1e-12):
            return {"gradients_differ": True, "grad_norm_step": step, "grad_norm": mine, "baseline_grad_norm": theirs}
    return {"gradients_differ": False}


def collective_differences(steps: dict, baseline_steps: dict, last: int) -> dict:
    """The first step up to `last` whose collectives differ, and each op that differs in it."""
    for step in range(1, last + 1):
        mine, theirs = steps.get(step, {}), baseline_steps.get(step, {})
        differing = [{"op": op, "calls": mine.get(op, (0, 0))[0], "wire_bytes": mine.get(op, (0, 0))[1],
                      "baseline_calls": theirs.get(op, (0, 0))[0], "baseline_wire_bytes": theirs.get(op, (0, 0))[1]}
                     for op in sorted(set(mine) | set(theirs)) if mine.get(op) != theirs.get(op)]
        if differing:
            return {"collective_step": step, "collectives": differing}
    return {"collective_step": None, "collectives": []}


def parameter_differences(run_dir: Path, baseline_dir: Path, last: int) -> dict:
    """The first step up to `last` after which some parameter norm differs, and the parameters that differ
    most there (name, the two norms), by relative difference; with the reason when they were not compared."""
    from zero_lab.workload.meters.parameter_norms import PARAMETER_NORMS_FILE, read_norms

    mine, my_reason = read_norms(Path(run_dir) / "logs" / PARAMETER_NORMS_FILE)
    theirs, their_reason = read_norms(Path(baseline_dir) / "logs" / PARAMETER_NORMS_FILE)
    steps = [step for step in sorted(set(mine) & set(theirs)) if step <= last]
    none = {"parameter_step": None, "parameters": [], "parameters_differing": 0, "parameters_reason": None}
    if not steps:
        return {**none, "parameters_reason": my_reason or their_reason or "no step has both runs' parameter norms"}
    for step in steps:
        shared = set(mine[step]) & set(theirs[step])
        if not shared:
            return {**none, "parameters_reason": "the two engines name their parameters differently"}
        differing = sorted(((abs(mine[step][name] - theirs[step][name]) / max(abs(theirs[step][name]), 1e-30), name)
                            for name in shared), reverse=True)
        differing = [(relative, name) for relative, name in differing if relative > PARAMETER_RTOL]
        if differing:
            return {"parameter_step": step, "parameters_differing": len(differing), "parameters_reason": None,
                    "parameters": [{"name": name, "norm": mine[step][name], "baseline_norm": theirs[step][name]}
                                   for _, name in differing[:SHOWN_PARAMETERS]]}
    return none


def loss_at(summary: dict, step: int) -> float:
    return float({int(key): value for key, value in summary["losses"].items()}[step])


def first_divergence(run: dict, baseline: dict, tolerance: float) -> dict | None:
    """The divergence record of `run` against `baseline` (two summaries of one cell); None when the
    losses agree at every step both have."""
    step = first_loss_step(run.get("losses") or {}, baseline.get("losses") or {}, tolerance)
    if step is None:
        return None
    record = {"world_size": run["world_size"], "stage": run["stage"], "impl": run["impl"],
              "baseline": baseline["impl"], "step": step,
              "loss": loss_at(run, step), "baseline_loss": loss_at(baseline, step)}
    record.update(first_grad_norm_step(per_step_grad_norms(run["run_dir"]),
                                       per_step_grad_norms(baseline["run_dir"]), step))
    record.update(parameter_differences(run["run_dir"], baseline["run_dir"], step))
    record.update(collective_differences(per_step_collectives(run["run_dir"]),
                                         per_step_collectives(baseline["run_dir"]), step))
    return record


def divergences(summaries: list[dict], baseline_impl: str, tolerance: float) -> list[dict]:
    """Every run that finished and parts from its cell's baseline run (the first repeat of each)."""
    firsts: dict[tuple, dict] = {}
    for summary in summaries:
        if summary.get("status") == "ok":
            firsts.setdefault((summary["world_size"], summary["stage"], summary["impl"]), summary)
    records = []
    for (world_size, stage, impl), run in firsts.items():
        baseline = firsts.get((world_size, stage, baseline_impl))
        if impl == baseline_impl or baseline is None:
            continue
        record = first_divergence(run, baseline, tolerance)
        if record is not None:
            records.append(record)
    return records


def divergence_lines(record: dict) -> list[str]:
    """The record in a learner's words: the step, the gradients, the parameters, the collectives."""
    who = f"world_size={record['world_size']} stage={record['stage']} {record['impl']} vs {record['baseline']}"
    lines = [f"{who}: losses part at step {record['step']} ({record['loss']:.8f} vs {record['baseline_loss']:.8f})"]
    if record["gradients_differ"] is True:
        lines.append(f"  gradients already differ at step {record['grad_norm_step']}: grad norm "
                     f"{record['grad_norm']:.6g} vs {record['baseline_grad_norm']:.6g}")
    elif record["gradients_differ"] is False:
        lines.append(f"  gradient norms agree up to step {record['step']}: the update, not the gradients, parts first")
    else:
        lines.append(f"  gradients: not compared ({record['reason']})")
    if record.get("parameter_step") is not None:
        lines.append(f"  parameters first differ after step {record['parameter_step']}: "
                     f"{record['parameters_differing']} by norm, most:")
        lines += [f"    {entry['name']} {entry['norm']:.8g} vs {entry['baseline_norm']:.8g}"
                  for entry in record["parameters"]]
    elif record.get("parameters_reason"):
        lines.append(f"  parameters: not compared ({record['parameters_reason']})")
    elif "parameter_step" in record:
        lines.append(f"  parameters: the same norms up to step {record['step']}")
    if record["collective_step"] is not None:
        for change in record["collectives"]:
            lines.append(f"  step {record['collective_step']}: {change['op']} {change['calls']} calls, "
                         f"{change['wire_bytes']:,} wire B vs {change['baseline_calls']} calls, "
                         f"{change['baseline_wire_bytes']:,} wire B")
    else:
        lines.append(f"  collectives: the same calls and wire bytes up to step {record['step']}")
    return lines
