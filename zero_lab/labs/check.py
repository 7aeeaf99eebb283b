"""`zero-lab lab check`'s four checks, over finished runs: pure, nothing started here.

For one world size the learner's run (the lab package as an impl) is held, in order, to:
    1. it runs: every step finished (else: the error, and the function still to write);
    2. losses, gradient norms, loss scales and parameters: step by step, the loss scale, the gradient
       norm and each parameter's norm after the step equal nano's at the same world size (nano is
       held to a single-process torch AdamW by its own tests), within a relative 1e-4 (norms of
       gradients; an overflowing step's infinite norm equals an infinite norm) and 1e-6 (of
       parameters), then every loss within the loss tolerance, over at least one real update (a
       learning rate above 0 that moved the parameters: `analysis.runs.updates`), else not tested;
       a parameter that differs names the mistake by how: it moved where the learning rate was 0,
       it did not move where nano's did, or it moved elsewhere (`Lab.evidence_hints`);
    3. bytes per rank by category: at the last step's phases (after forward, after backward, after
       the step), each category the engine counts equals nano's, which nano's tests hold to the
       formula of zero_lab/nano/memory/memory_formula.py; and all that the rank holds after backward and
       after the step (the memory tracker's live bytes) is no more than nano's;
    4. wire bytes per collective: per step, the same collective types, each with the same wire bytes.
Each check gives a `Result`; the first that fails stops the check, with a hint that names the
likely mistake when its figures match one (`checks_in_order`; `printed` is what `lab check` prints of a result).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from zero_lab.analysis.compare.divergence import (PARAMETER_RTOL, SHOWN_PARAMETERS, divergence_lines, first_divergence,
                                                  per_step, per_step_grad_norms)
from zero_lab.analysis.runs.updates import updates_compared
from zero_lab.labs.catalog import Lab

GRAD_NORM_RTOL = 1e-4
# A failed run's last words that name a mistake (`Lab.evidence_hints`): torch's words for tensors of unequal
# sizes (an operation, a copy, a collective's output), and for a tensor used while its storage is released.
FAILURE_EVIDENCE = (
    ("size_mismatch", r"must match the size|size mismatch|shape .* doesn't match|Tensor sizes|expected .* elements"),
    ("no_storage", r"out of bounds for storage of size 0"),
    ("wrong_dtype", r"expected dtype|expected scalar type|dtype mismatch"),
)
CHECKED_PHASES = ("after_forward", "after_backward", "after_step")
HELD_PHASES = ("after_backward", "after_step")


@dataclass(frozen=True)
class Result:
    """One check at one world size: passed or not, what was compared, and a hint when it failed."""

    check: str
    world_size: int
    ok: bool
    lines: tuple[str, ...]
    hint: str = ""


def missing_function(log_tail: str, lab: Lab) -> str | None:
    """The function the skeleton still asks for, from a failed run's NotImplementedError."""
    found = re.findall(r"NotImplementedError: lab \w+: write (\w+)", log_tail or "")
    return found[-1] if found else None


def check_runs(run: dict, lab: Lab) -> Result:
    world_size = run["world_size"]
    if run.get("status") == "ok":
        return Result("runs", world_size, True, (f"{run['steps']} steps finished",))
    function = missing_function(run.get("log_tail", ""), lab)
    if function:
        return Result("runs", world_size, False, (f"the engine stopped: lab {lab.name}'s {function} is not written yet",),
                      f"write {function} in lab.py: its docstring states the contract")
    tail = [line for line in (run.get("error") or run.get("log_tail") or "").splitlines() if line.strip()]
    named = next((lab.evidence_hints[situation] for situation, words in FAILURE_EVIDENCE
                  if situation in lab.evidence_hints and any(re.search(words, line) for line in tail)), None)
    return Result("runs", world_size, False, (f"the run ended {run.get('status')}: {tail[-1] if tail else 'no output'}",
                                              f"logs: {run.get('run_dir')}"),
                  named or "run it alone to see the whole traceback: zero-lab run --impl NAME=DIR --gpus 2 --device cpu "
                           "--model tiny")


def parameters_after(mine: dict[int, dict[str, float]], nano_norms: dict[int, dict[str, float]], nano: dict,
                     step: int) -> tuple[str, tuple[str, ...]] | None:
    """How the learner's parameters after `step` differ from nano's, by norm (`mine` and `nano_norms`:
    rank 0's parameter-norms files, read once): None when they agree or were not compared; else the situation (a key of
    `Lab.evidence_hints`) and the lines that show it:
        moved_at_zero_lr: they changed in a step whose learning rate was 0, where nano's did not;
        did_not_move: an update moved nano's and left some of the learner's where they were;
        moved_differently: both moved, to different values."""
    if not all(step in norms and step - 1 in norms for norms in (mine, nano_norms)):
        return None
    after, theirs = mine[step], nano_norms[step]
    differing = [name for name in theirs if name in after
                 and abs(after[name] - theirs[name]) > PARAMETER_RTOL * max(abs(theirs[name]), 1e-30)]
    if not differing:
        return None
    before = mine[step - 1]
    learning_rate = ((nano.get("updates") or {}).get(str(step)) or {}).get("lr")
    stayed = [name for name in differing if after[name] == before.get(name)]
    situation = ("moved_at_zero_lr" if learning_rate == 0 else "did_not_move" if stayed else "moved_differently")
    rate = "" if learning_rate is None else f" (learning rate {learning_rate:g})"
    stayed_words = f", {len(stayed)} of them did not move" if stayed else ""
    lines = (f"after step {step}{rate}: {len(differing)} parameters differ from nano's by norm{stayed_words}; "
             "for example:",
             *(f"  {name}: {after[name]:.8g} (before the step {before.get(name, float('nan')):.8g}), nano's "
               f"{theirs[name]:.8g}" for name in (stayed or differing)[:SHOWN_PARAMETERS]))
    return situation, lines


def norms_of(run: dict) -> dict[int, dict[str, float]]:
    from zero_lab.workload.meters.parameter_norms import PARAMETER_NORMS_FILE, read_norms

    return read_norms(Path(run["run_dir"]) / "logs" / PARAMETER_NORMS_FILE)[0]


def check_losses(run: dict, nano: dict, tolerance: float, lab: Lab) -> Result:
    """Step by step: the loss scale, the gradient norm, then the parameters after the step; then the
    losses, and how many real updates they compared (none: not tested, so not passed)."""
    world_size = run["world_size"]
    divergence = first_divergence(run, nano, tolerance)
    scales, nano_scales = per_step(run["run_dir"], "loss_scale"), per_step(nano["run_dir"], "loss_scale")
    norms, nano_norms = per_step_grad_norms(run["run_dir"]), per_step_grad_norms(nano["run_dir"])
    parameters, nano_parameters = norms_of(run), norms_of(nano)
    for step in sorted(nano_norms):
        if step in nano_scales and scales.get(step) != nano_scales[step]:
            overflowed = nano_norms.get(step) == float("inf")
            return Result("losses", world_size, False,
                          (f"step {step}{' (an overflow: skipped)' if overflowed else ''}: loss scale after the step "
                           f"{scales.get(step, float('nan')):g}, nano's {nano_scales[step]:g}",),
                          lab.hints[1] if overflowed else lab.hints[-1])
        mine, theirs = norms.get(step, float("nan")), nano_norms[step]
        if mine != theirs and not abs(mine - theirs) <= GRAD_NORM_RTOL * abs(theirs):
            ratio = mine / theirs if theirs else float("nan")
            hint = (f"your gradient norm is {ratio:.4g} x nano's: {lab.hints[0]}"
                    if abs(ratio - world_size) < 0.01 * world_size else
                    lab.later_step_hint if step > 1 else lab.hints[0])
            lines = (f"step {step}: gradient norm {mine:.6g}, nano's {theirs:.6g}",)
            return Result("losses", world_size, False, lines + tuple(divergence_lines(divergence) if divergence else ()),
                          hint)
        parted = parameters_after(parameters, nano_parameters, nano, step)
        if parted is not None:
            situation, lines = parted
            return Result("losses", world_size, False, (f"step {step}: gradient norm as nano's", *lines),
                          lab.evidence_hints.get(situation, lab.hints[-1]))
    if divergence is not None:
        return Result("losses", world_size, False, tuple(divergence_lines(divergence)), lab.hints[-1])
    last = max(nano_norms, default=None)
    updates = updates_compared(last, run, nano)
    compared = "parameters after every step equal nano's by norm" if nano_parameters else \
        "parameters not compared (partitioned between steps)"
    if updates == 0:
        return Result("losses", world_size, False,
                      (f"{len(nano_norms)} steps agree, but their losses show no update with a learning rate above 0: "
                       "not tested",),
                      "run more steps (--steps): the harness's learning rate starts at 0, so a loss shows an update "
                      "only from step 4 on")
    return Result("losses", world_size, True,
                  (f"{len(nano_norms)} steps: losses within {tolerance:g} over {updates} update"
                   f"{'' if updates == 1 else 's'}, gradient norms within a relative {GRAD_NORM_RTOL:g}, loss scales "
                   f"equal to nano's, {compared}",))


def phase_rows(run: dict) -> dict[str, dict]:
    """The last step's `[phase]` samples of a run, by phase."""
    phases = run.get("phases") or []
    last = max((sample["step"] for sample in phases), default=None)
    return {sample["phase"]: sample for sample in phases if sample["step"] == last}


def category_hint(category: str, mine: int, theirs: int, world_size: int, lab: Lab) -> str:
    """The mistake the figures point at, when they point at one."""
    if category == "optimizer_states" and mine == theirs * world_size:
        return "Adam's states are whole: partition_bounds must give this rank only its slice (P/N elements)"
    owner = "gradient_ready: " if "gradient_ready" in lab.functions else ""
    if category == "gradients" and mine and not theirs:
        return f"{owner}full gradients are still held after backward: release parameter.grad once it is in the bucket"
    if category == "communication_buckets" and mine:
        return (f"{owner}the gradient bucket outlives its reduce-scatter: release it (free_storage(group.bucket), "
                "then None)")
    if category == "fp32_master_partition" and mine and theirs and mine != theirs:
        return (f"host_master_partition: the master holds {mine:,} B where an fp32 copy of the partition holds "
                f"{theirs:,} B: 4 B per element, in float32")
    if category == "fp32_master_partition" and theirs and not mine:
        return ("host_master_partition: no fp32 master partition of its own: Adam updates the partition itself, on "
                "the device. The master "
                "is a new fp32 tensor on the host holding the partition's values (clone it: .to() returns the "
                "tensor itself when it is already there)")
    if category == "gathered_parameters" and mine:
        return ("release_unit: a unit's gathered parameters outlive its use: release all of the unit's storage after "
                "forward and after backward")
    return lab.hints[1]


def check_bytes(run: dict, nano: dict, lab: Lab) -> Result:
    world_size = run["world_size"]
    mine, theirs = phase_rows(run), phase_rows(nano)
    lines = []
    for phase in CHECKED_PHASES:
        for key, expected in theirs.get(phase, {}).items():
            if not key.endswith("_bytes") or key in ("live_bytes", "peak_bytes", "step"):
                continue
            measured = mine.get(phase, {}).get(key, 0)
            if measured != expected:
                category = key[:-len("_bytes")]
                return Result("bytes", world_size, False,
                              (f"{phase}: {category} {measured:,} B, the formula (nano's) {expected:,} B",),
                              category_hint(category, measured, expected, world_size, lab))
    for phase in HELD_PHASES:
        held, nano_held = mine.get(phase, {}).get("live_bytes"), theirs.get(phase, {}).get("live_bytes")
        if held is None or nano_held is None:
            continue
        if held > nano_held:
            return Result("bytes", world_size, False,
                          (f"{phase}: this rank holds {held:,} B, {held - nano_held:,} B more than nano's {nano_held:,} B "
                           "(a tensor the engine's categories do not count)",),
                          "something outlives its use: a temporary kept on an attribute, or a buffer never released")
        lines.append(f"{phase}: holds {held:,} B (nano {nano_held:,} B)")
    return Result("bytes", world_size, True, ("every category equals the formula", *lines))


def wire_per_op(run: dict) -> dict[str, tuple[int, int]]:
    """{op: (calls per step, wire bytes per step)} from the run's `[comm]` lines."""
    steps = max(1, int(run.get("steps") or 1))
    return {line["op"]: (int(line["calls"]) // steps, int(line["wire_bytes_per_step"])) for line in run.get("comm") or []}


def check_wire(run: dict, nano: dict, lab: Lab) -> Result:
    world_size = run["world_size"]
    mine, theirs = wire_per_op(run), wire_per_op(nano)
    differing = [op for op in sorted(set(mine) | set(theirs)) if mine.get(op, (0, 0))[1] != theirs.get(op, (0, 0))[1]]
    if differing:
        lines = tuple(f"{op}: {mine.get(op, (0, 0))[0]} calls, {mine.get(op, (0, 0))[1]:,} wire B per step; nano's "
                      f"{theirs.get(op, (0, 0))[0]} calls, {theirs.get(op, (0, 0))[1]:,} B" for op in differing)
        extra_all_reduce = mine.get("all_reduce", (0, 0))[1] > theirs.get("all_reduce", (0, 0))[1]
        short = {op: lab.function_of_collective[op] for op in differing
                 if op in lab.function_of_collective and mine.get(op, (0, 0))[1] < theirs.get(op, (0, 0))[1]}
        where = "".join(f" ({function} no longer issues nano's {op})" for op, function in short.items())
        hint = ("you all-reduce where nano reduce-scatters or all-gathers" + where + ": an all-reduce sends 2 (N-1)/N "
                "of the buffer, a reduce-scatter or an all-gather (N-1)/N") if extra_all_reduce else lab.hints[-1]
        return Result("wire", world_size, False, lines, hint)
    return Result("wire", world_size, True,
                  tuple(f"{op}: {calls} calls, {wire:,} wire B per step, as nano" for op, (calls, wire) in sorted(mine.items())))


def checks_in_order(mine: dict, lab: Lab, nano, tolerance: float) -> list[Result]:
    """The four checks of one world size, in order, up to the first that fails; `nano()` gives nano's
    run, asked for only once the learner's has run."""
    results = [check_runs(mine, lab)]
    if results[-1].ok:
        reference = nano()
        for step in (lambda: check_losses(mine, reference, tolerance, lab), lambda: check_bytes(mine, reference, lab),
                     lambda: check_wire(mine, reference, lab)):
            results.append(step())
            if not results[-1].ok:
                break
    return results


def printed(result: Result) -> list[str]:
    """The lines `lab check` prints for one result: PASS or FAIL, what was compared, the hint."""
    lines = [f"{'PASS' if result.ok else 'FAIL'} {result.check} (world size {result.world_size})"]
    lines += [f"  {line}" for line in result.lines]
    return lines + ([f"  hint: {result.hint}"] if result.hint else [])

