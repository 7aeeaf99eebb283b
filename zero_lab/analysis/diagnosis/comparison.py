"""The findings between runs of one workload: losses that part, and categories held in different dtypes.

Runs compare when they trained the same workload: the same model, sequence length, micro-batch,
world size and accumulation (the stage and the impl may differ: every ZeRO stage and impl should
give the same losses, within the precision's tolerance). In each group the reference is the
comparison's baseline impl at its lowest stage (or the first run given), and every other run is
set against it.

`loss-divergence` (error): the first step whose losses differ by more than the tolerance
    (`metrics.resolve_loss_tol`, or the comparison's own), and why, read from the steps before it:
        the losses already differed at step 1         the forward differed: weights, data, compute dtype;
        a gradient norm (before clipping) differed    the gradients differed: the reduction or the
          at an earlier step while the losses agreed    precision of the backward;
        the learning rate of an update before it      the schedule (update k's rate: `update_lr`,
          differed                                      else the `lr` logged after step k-1);
        neither                                       the update differed: the optimizer's settings,
                                                        by key where the two configs differ (weight
                                                        decay and what it applies to, eps, betas,
                                                        bias correction).
`dtype-difference` (info): impls that hold a category in different dtypes (the `[model]` and `[zero]`
    lines: stored parameters, the forward's parameters, the weights Adam updates, the reduction).
"""

from __future__ import annotations

import math

from zero_lab.analysis.diagnosis.finding import Finding
from zero_lab.analysis.diagnosis.run_data import RunData
from zero_lab.analysis.runs.logparse import is_number
from zero_lab.analysis.compare.divergence import first_loss_step
from zero_lab.analysis.compare.metrics import DEFAULT_LOSS_TOL, resolve_loss_tol
from zero_lab.analysis.runs.updates import step_updates

HALF = ("bfloat16", "float16")


def workload_key(run: RunData) -> tuple:
    model = run.log.model
    return (model.get("name"), model.get("seq_len"), model.get("micro_batch"), run.world_size,
            run.log.zero.get("gradient_accumulation_steps"))


def groups(runs: list[RunData], baseline: str | None = None) -> list[list[RunData]]:
    """Runs of one workload together, each group's reference (the baseline impl's lowest stage) first."""
    found: dict[tuple, list[RunData]] = {}
    for run in runs:
        if run.steps():
            found.setdefault(workload_key(run), []).append(run)
    return [sorted(group, key=lambda run: (run.impl != baseline, run.stage or 0)) for group in found.values()
            if len(group) > 1]


def by_step(run: RunData, field: str, finite_only: bool = False) -> dict[int, float]:
    """The field's value at each step that logged a number (finite_only: leave out nan, which an
    engine logs for a figure it does not compute, as official's stage 0 for grad_norm)."""
    values = {int(row["step"]): float(row[field]) for row in run.steps() if is_number(row.get(field))}
    return {step: value for step, value in values.items() if math.isfinite(value) or not finite_only}


def update_rates(run: RunData) -> dict[int, float]:
    """The learning rate each step's update used (`runs.updates`: `update_lr`, else the `lr` logged
    after the step before, which is what the scheduler set for the next update)."""
    return {int(step): update["lr"] for step, update in step_updates(run.steps(), {}).items()
            if update["lr"] is not None}


def optimizer_differences(config: dict, reference: dict) -> list[tuple[str, object, object]]:
    """(dotted key, this run's value, the reference's) for each optimizer setting the two configs give
    differently (`optimizer.type`, `optimizer.params.*`); [] when either config has no optimizer section."""
    mine, theirs = config.get("optimizer"), reference.get("optimizer")
    if not isinstance(mine, dict) or not isinstance(theirs, dict):
        return []
    found = [("optimizer.type", mine.get("type"), theirs.get("type"))] if mine.get("type") != theirs.get("type") else []
    params, their_params = mine.get("params") or {}, theirs.get("params") or {}
    return found + [(f"optimizer.params.{key}", params.get(key), their_params.get(key))
                    for key in sorted(set(params) | set(their_params)) if params.get(key) != their_params.get(key)]


def differs(first: float, second: float, tolerance: float, relative: bool = False) -> bool:
    """Beyond the tolerance (relative to the larger magnitude when asked); a NaN on one side only differs."""
    if math.isnan(first) or math.isnan(second):
        return math.isnan(first) != math.isnan(second)
    scale = max(abs(first), abs(second)) if relative else 1.0
    return abs(first - second) > tolerance * scale


def loss_divergence(reference: RunData, run: RunData, tolerance: float) -> list[Finding]:
    losses, theirs = by_step(run, "loss"), by_step(reference, "loss")
    common = sorted(set(losses) & set(theirs))
    parted = first_loss_step(losses, theirs, tolerance)  # the step `compare`'s divergence names, by one rule
    if parted is None:
        return []
    gradient_tolerance = max(DEFAULT_LOSS_TOL.get(r.precision, DEFAULT_LOSS_TOL["fp32"]) for r in (reference, run))
    norms, their_norms = by_step(run, "grad_norm", finite_only=True), by_step(reference, "grad_norm", finite_only=True)
    rates, their_rates = update_rates(run), update_rates(reference)
    before = [step for step in common if step < parted]
    gradients_parted = next((step for step in before if step in norms and step in their_norms
                             and differs(norms[step], their_norms[step], gradient_tolerance, relative=True)), None)
    # the loss at `parted` shows the updates before it: the first of those whose learning rates differ
    rate_parted = next((step for step in before if step in rates and step in their_rates
                        and differs(rates[step], their_rates[step], 1e-9, relative=True)), None)
    evidence = [f"step {parted}: loss {losses[parted]:.9g} ({run.label}) against {theirs[parted]:.9g} "
                f"({reference.label}), {abs(losses[parted] - theirs[parted]):.3g} apart; tolerance {tolerance:g}"]
    if before:
        evidence.append(f"steps {before[0]}-{before[-1]} agree within the tolerance")
    norm_steps = [step for step in common if step <= parted and step in norms and step in their_norms]
    evidence += [f"gradient norm at step {step}: {norms[step]:.6g} against {their_norms[step]:.6g}" for step in norm_steps]
    if parted == common[0]:
        cause = ("the forward already differed at the first step, before any update: the weights, the data or the "
                 "compute dtype are not the same")
        fix = "train both from the same weights and batches (--seed, --dataset-path) in the same precision (--dtype)"
    elif gradients_parted is not None:
        cause = (f"the gradients differed at step {gradients_parted} while the losses still agreed: the gradient "
                 "reduction (averaging, predivide, communication_data_type) or the precision of the backward")
        fix = "give both the same reduction settings and precision; compare their [comm] lines for the reduction's dtype"
    elif rate_parted is not None:
        cause = (f"the learning rate of step {rate_parted}'s update differed ({rates[rate_parted]:g} against "
                 f"{their_rates[rate_parted]:g}): the schedules are not the same")
        fix = "give both the same scheduler section"
    else:
        keys = optimizer_differences(run.config, reference.config)
        named = "; ".join(f"{key} {mine} against {theirs}" for key, mine, theirs in keys)
        cause = (f"the gradients agreed but the update did not: the optimizer's settings differ ({named})" if keys else
                 "the gradients agreed but the update did not: the optimizer's settings differ (weight_decay and "
                 "which parameters it applies to, eps, betas, bias correction)")
        fix = ("give both the same optimizer section; with Hugging Face, TrainingArguments' weight_decay defaults to 0 "
               "while a DeepSpeed config's optimizer keeps its own")
    return [Finding("loss-divergence", f"{run.label} against {reference.label}: the losses part at step {parted}",
                    evidence, cause, fix, runs=[run.name, reference.name],
                    figures={"step": parted, "loss": losses[parted], "reference_loss": theirs[parted],
                             "tolerance": tolerance, "gradients_parted_at": gradients_parted,
                             "learning_rate_parted_at": rate_parted})]


def dtype_name(value) -> str:
    return str(value).removeprefix("torch.") if value is not None else "?"


def dtypes_of(run: RunData) -> dict[str, str]:
    """Each category's dtype in one run, from its `[model]` and `[zero]` lines."""
    stored, compute = dtype_name(run.log.model.get("param_dtype")), dtype_name(run.log.model.get("compute_dtype"))
    reduced = run.log.zero.get("communication_data_type")
    reduced = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}.get(str(reduced), stored if run.impl != "fsdp2"
                                                                               else compute)
    updated = "float32 (the parameters)" if stored == "float32" else "float32 (a master copy)"
    return {"parameters, stored": stored, "parameters, in the forward": compute, "weights Adam updates": updated,
            "gradients, reduced in": reduced}


def dtype_difference(runs: list[RunData]) -> list[Finding]:
    """One finding per group of one workload whose impls (or one impl's runs in other precisions) hold a
    category in different dtypes."""
    impls = {}
    distinct = len({run.impl for run in runs}) == len(runs)  # else one impl twice: told apart by precision
    for run in runs:
        impls.setdefault(run.impl if distinct else f"{run.impl} {run.precision}", dtypes_of(run))
    if len(impls) < 2:
        return []
    categories = list(next(iter(impls.values())))
    differing = [category for category in categories if len({held[category] for held in impls.values()}) > 1]
    if not differing:
        return []
    table = [["category", *impls]] + [[category, *(held[category] for held in impls.values())] for category in categories]
    stored = {impl: held["parameters, stored"] for impl, held in impls.items()}
    kept_whole = [impl for impl, dtype in stored.items() if dtype == "float32"]
    halves = [impl for impl, dtype in stored.items() if dtype in HALF]
    if kept_whole and halves:
        effect = (f"{', '.join(kept_whole)} store fp32 parameters and round them to the forward's dtype at each use, "
                  f"{', '.join(halves)} store 16-bit parameters beside an fp32 master: both update in fp32, so the "
                  "losses agree within the half-precision tolerance, while the bytes per parameter differ (4 against "
                  "2 + 4). An impl that updated 16-bit weights directly would lose updates smaller than a weight's "
                  "16-bit spacing, and seem to need a larger learning rate")
    else:
        effect = ("the categories that differ change what is rounded where: compare the losses and gradient norms "
                  "step by step before comparing learning rates")
    return [Finding("dtype-difference", f"{', '.join(impls)} hold {', '.join(differing)} in different dtypes",
                    [f"{row[0]}: " + ", ".join(f"{impl} {dtype}" for impl, dtype in zip(impls, row[1:]))
                     for row in table[1:] if row[0] in differing],
                    effect, "nothing to fix if intended; to compare learning rates across impls, compare runs whose "
                    "weights Adam updates are in the same dtype",
                    runs=[run.name for run in runs], table=table,
                    figures={"dtypes": impls, "differing": differing})]


def comparison_findings(runs: list[RunData], baseline: str | None = None, tolerance: float | None = None) -> list[Finding]:
    """Every loss-divergence and dtype-difference among `runs`."""
    findings = []
    for group in groups(runs, baseline):
        reference = group[0]
        resolved = resolve_loss_tol(tolerance, [run.precision for run in group])
        for run in group[1:]:
            findings += loss_divergence(reference, run, resolved)
        findings += dtype_difference(group)
    return findings
