"""Where a rank is in its training loop: start-up, then forward, backward and the optimizer step of
every micro-step, and between steps.

The training loop (the harness's, or a client's through `clients.step_hook`) enters each phase
before the call that runs it; what reads it: an out-of-memory's one line (`faults.out_of_memory`),
the flight record of collectives (`meters.comm_meter`), and the timeline's spans (`tracing.timeline`).
"""

from __future__ import annotations

import enum


class Phase(enum.Enum):
    """Where a rank is in its run (an allocation that fails is said to fail there)."""

    START_UP = "start-up"  # building the model and the engine, loading a checkpoint
    FORWARD = "forward"
    BACKWARD = "backward"
    STEP = "step"  # the optimizer step (engine.step)
    BETWEEN_STEPS = "between steps"  # logging, saving a checkpoint


class StepPhase:
    """Phase 1: the phase a rank is in now, and the optimizer step (None before the first); the
    training loop sets them before each call (the flight record reads them too, `comm_meter`)."""

    def __init__(self) -> None:
        self.current = Phase.START_UP
        self.step: int | None = None
        self.observers: list = []  # called with this StepPhase after each enter (a timeline: `--trace`)

    def enter(self, phase: Phase, step: int | None = None) -> None:
        self.current = phase
        if step is not None:
            self.step = step
        for observer in self.observers:
            observer(self)
