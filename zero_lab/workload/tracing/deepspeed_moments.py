"""Official DeepSpeed's own phases of the optimizer step, watched from outside for a timeline (`--trace`).

DeepSpeed's ZeRO optimizers time their phases with named timers whether anyone reads them or not:
    stages 1 and 2   `optimizer_gradients` (each group's gradient partition made fp32, unscaled
                     and clipped), `optimizer_step` (the torch optimizer on the partition, and the
                     copy back into the 16-bit partition), `optimizer_allgather` (every rank's
                     updated partition gathered into every rank's parameters);
    stage 3          `optimizer_step` (every sub-group's update, the partitions put back).
Without `wall_clock_breakdown` the timers are DeepSpeed's no-op ones (`NoopTimer`), with it
`SynchronizedWallClockTimer`'s. While a timeline watches, both groups hand out timers that also
tell the observer when each starts and stops, under DeepSpeed's own names; what DeepSpeed
measures and logs is unchanged.

Phase 1: `watch(observer)`, called when a traced step begins: DeepSpeed is watched only when its
         timer module is already loaded (an official run has built its engine by then; a nano or
         FSDP2 run never imports it for this).
Phase 2: DeepSpeed's optimizer calls `timers(name).start()` and `.stop()`; the observer hears
         `observer("deepspeed", name, True)` and `(..., False)`.
Phase 3: the returned function restores both groups' `__call__`.
"""

from __future__ import annotations

import sys
from typing import Callable

Observer = Callable[[str, str, bool], None]
TIMER_MODULE = "deepspeed.utils.timer"
TIMER_GROUPS = ("NoopTimer", "SynchronizedWallClockTimer")


class ToldTimer:
    """One of DeepSpeed's timers, telling the observer as it starts and stops; anything else is the timer's own."""

    def __init__(self, name: str, timer, observer: Observer):
        self.name, self.timer, self.observer = name, timer, observer

    def start(self, *args, **kwargs):
        self.observer("deepspeed", self.name, True)
        return self.timer.start(*args, **kwargs)

    def stop(self, *args, **kwargs):
        result = self.timer.stop(*args, **kwargs)
        self.observer("deepspeed", self.name, False)
        return result

    def __getattr__(self, attribute):
        return getattr(self.timer, attribute)


def watch(observer: Observer) -> Callable[[], None]:
    """Phase 1 (and 3): DeepSpeed's timer groups told to `observer`; returns `unwatch` (nothing to do
    when DeepSpeed is not loaded)."""
    module = sys.modules.get(TIMER_MODULE)
    groups = [getattr(module, name) for name in TIMER_GROUPS if hasattr(module, name)] if module else []
    originals = {group: group.__call__ for group in groups}

    def told_call(original):
        def call(self, name):
            return ToldTimer(name, original(self, name), observer)
        return call

    for group, original in originals.items():
        group.__call__ = told_call(original)

    def unwatch() -> None:
        for group, original in originals.items():
            group.__call__ = original

    return unwatch
