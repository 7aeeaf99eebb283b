"""Which optimizer steps made a real update, and how many real updates a comparison of losses saw.

A loss is computed before its step's update, so the loss of step k reflects updates 1 .. k-1: two
runs whose losses agree up to step K have compared the updates 1 .. K-1, and only those that changed
something. The harness's configs warm the learning rate up from 0 (WarmupLR, `warmup_min_lr: 0`), so
their first two updates change nothing and a run of 3 steps compares no update at all: its losses
would agree with an optimizer that does not work.

An update is *real* when its learning rate is above 0, the engine applied it (not a skipped step:
fp16 overflow, a non-finite gradient norm) and, where the run wrote parameter norms (stages 0-2 of
the harness: `workload.meters.parameter_norms`), some parameter's norm moved.

Phase 1: `step_updates(steps, norms)`: per step of a run's log, {lr, applied, moved}, for summary.json.
         The learning rate is the `[opt_step]` line's `update_lr`; a log without it (the seed's, an
         older run's) gives the `lr` printed after the step before (schedulers step inside
         `engine.step()`), unknown for its first step.
Phase 2: `real_updates(summary)`: the steps whose update was real, from summary.json's `updates`.
Phase 3: `updates_compared(last_step, *runs)`: how many updates before `last_step` were real in
         every run compared.
"""

from __future__ import annotations

import math


def is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def moved(norms: dict[int, dict[str, float]], step: int) -> bool | None:
    """Whether some parameter norm after `step` differs from the one before it; None when unknown."""
    before, after = norms.get(step - 1), norms.get(step)
    if before is None or after is None or set(before) != set(after):
        return None
    return any(before[name] != after[name] for name in after)


def step_updates(steps: list[dict], norms: dict[int, dict[str, float]]) -> dict[str, dict]:
    """Phase 1: {"k": {"lr": ..., "applied": ..., "moved": ...}} per logged step k (JSON keys)."""
    updates, previous = {}, {}
    for row in steps:
        step = int(row["step"])
        lr = row.get("update_lr")
        if not is_number(lr):
            lr = previous.get("lr") if previous.get("step") == step - 1 else None
        updates[str(step)] = {"lr": lr if is_number(lr) else None,
                              "applied": row.get("update_applied", True) is not False,
                              "moved": moved(norms, step)}
        previous = row
    return updates


def real_updates(summary: dict) -> set[int]:
    """Phase 2: the steps of a run whose update was real (an unknown learning rate is not counted)."""
    return {int(step) for step, update in (summary.get("updates") or {}).items()
            if is_number(update.get("lr")) and update["lr"] > 0 and update.get("applied", True)
            and update.get("moved") is not False}


def updates_compared(last_step: int | None, *summaries: dict, first_step: int = 1) -> int:
    """Phase 3: the updates from `first_step` (a resumed run's first: the updates it made itself) to
    before `last_step` (the last step whose losses were compared) that were real in every run; 0
    when nothing was compared."""
    if last_step is None:
        return 0
    real = set.intersection(*(real_updates(summary) for summary in summaries))
    return sum(1 for step in real if first_step <= step < last_step)
