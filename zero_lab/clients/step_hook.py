"""An engine's forward, backward and step, wrapped so that they print the log contract's step lines
exactly as the built-in workload's loop does (`harness/train.py`), with the same `StepMetrics`.

A script calls, per micro-step, `engine(batch)` (forward), `engine.backward(loss)` and
`engine.step()`; the engine steps its optimizer at the accumulation boundary, where its
`global_steps` grows. So:
    forward:  the first training forward after a boundary opens the step (time, communication
              counts); each later one starts a new micro-step, whose phases replace the previous
              one's (the contract samples the last micro-step); the input's tokens are counted;
    backward: the micro-step's loss is kept, and the memory after the backward sampled;
    step:     when `global_steps` grew, the step closes: memory after the step, `[opt_step k]`,
              its `[phase]` lines and any `[warn]`; the step's collectives join the totals of `[comm]`.
Forwards without gradients (evaluation) pass through unmeasured, and so does everything between
steps (a checkpoint save, a client's logging), as in the built-in workload. Each call also moves the
meter's `StepPhase` (when it keeps a flight record), so its collectives are recorded with their
step and engine call.
"""

from __future__ import annotations

import torch

from zero_lab.workload.meters.comm_meter import CommMeter, OpCount, accumulate, difference
from zero_lab.workload.log_contract.contract_lines import emit, model_header, opt_step_fields
from zero_lab.workload.meters.memory_meter import MemoryMeter
from zero_lab.workload.step_phase import Phase, StepPhase
from zero_lab.workload.meters.step_metrics import StepMetrics, comm_totals, step_warnings


def input_tokens(args: tuple, kwargs: dict) -> torch.Tensor | None:
    """The forward's token ids: `input_ids`, else its first tensor argument."""
    if isinstance(kwargs.get("input_ids"), torch.Tensor):
        return kwargs["input_ids"]
    return next((value for value in (*args, *kwargs.values()) if isinstance(value, torch.Tensor)), None)


def precision_of(engine) -> str:
    if engine.bfloat16_enabled():
        return "bf16"
    return "fp16" if engine.fp16_enabled() else "fp32"


def model_name(module: torch.nn.Module) -> str:
    """The Hugging Face model's directory or name when it has one, else the module's class."""
    return getattr(getattr(module, "config", None), "_name_or_path", "") or type(module).__name__


class StepHook:
    def __init__(self, engine, impl: str, comm: CommMeter, memory: MemoryMeter, rank: int, world_size: int,
                 formula: dict | None):
        self.engine = engine
        self.rank = rank
        self.formula = formula
        self.comm = comm
        self.device = next(engine.module.parameters()).device
        self.metrics = StepMetrics(memory, comm, self.device, world_size)
        self.world_size = world_size
        # nano names the buffers it holds; official DeepSpeed's `memory_breakdown` is a config flag.
        self.breakdown = getattr(engine, "memory_breakdown", None) if impl == "nano" else None
        self.open = False  # inside an optimizer step (between its first forward and its boundary)
        self.model_printed = False
        self.steps = 0
        self.comm_total: dict[str, OpCount] = {}
        self.phase = comm.phase or StepPhase()  # where the engine is: the flight record's step and call

    def install(self) -> None:
        """Wrap the engine's own methods on the instance (what `engine(...)` and clients call)."""
        forward, backward, step = self.engine.forward, self.engine.backward, self.engine.step
        self.engine.forward = lambda *args, **kwargs: self.forward(forward, args, kwargs)
        self.engine.backward = lambda loss, *args, **kwargs: self.backward(backward, loss, args, kwargs)
        self.engine.step = lambda *args, **kwargs: self.step(step, args, kwargs)

    def forward(self, original, args: tuple, kwargs: dict):
        if not (torch.is_grad_enabled() and self.engine.training):
            return original(*args, **kwargs)
        self.phase.enter(Phase.FORWARD, self.engine.global_steps + 1)
        if not self.open:
            self.open, self.tokens = True, 0
            self.metrics.begin()
            self.comm_before = self.comm.snapshot()
        else:
            self.metrics.phases.clear()  # a new micro-step: the step's phases are its last one's
        tokens = input_tokens(args, kwargs)
        if tokens is not None:
            self.tokens += tokens.numel()
            if not self.model_printed:
                self.print_model(tokens)
        output = original(*args, **kwargs)
        self.metrics.sample_phase("after_forward", self.breakdown)
        return output

    def backward(self, original, loss, args: tuple, kwargs: dict):
        self.phase.enter(Phase.BACKWARD)
        result = original(loss, *args, **kwargs)
        if self.open:
            self.metrics.sample_phase("after_backward", self.breakdown)
            self.metrics.add_loss(loss)
        return result

    def step(self, original, args: tuple, kwargs: dict):
        steps_before, skipped_before = self.engine.global_steps, self.engine.skipped_steps
        self.phase.enter(Phase.STEP)
        update_lr = self.engine.get_lr()[0]  # the learning rate this call's update uses
        result = original(*args, **kwargs)
        self.phase.enter(Phase.BETWEEN_STEPS)
        if not self.open or self.engine.global_steps == steps_before:
            return result  # inside an accumulation window
        self.metrics.sample_phase("after_step", self.breakdown)
        accumulate(self.comm_total, difference(self.comm.snapshot(), self.comm_before))
        applied = self.engine.skipped_steps == skipped_before
        fields = opt_step_fields(self.engine, self.metrics.end(self.tokens * self.world_size), self.breakdown,
                                 update_lr, applied)
        step = self.engine.global_steps
        emit(self.rank, "opt_step", fields, step)
        for sample in self.metrics.phases:
            emit(self.rank, "phase", sample.fields(step))
        for warning in step_warnings(step, fields["loss"], fields["loss_scale"], skipped=not applied):
            emit(self.rank, "warn", warning)
        self.open = False
        self.steps += 1
        return result

    def print_model(self, tokens: torch.Tensor) -> None:
        """`[model]`, once the first batch says the sequence length and the micro-batch."""
        module = self.engine.module
        seq_len = tokens.shape[-1]
        micro_batch = tokens.numel() // seq_len if seq_len else 0
        emit(self.rank, "model", model_header(
            model_name(module), self.engine, precision_of(self.engine), self.device, seq_len, micro_batch,
            bool(getattr(module, "is_gradient_checkpointing", False)), self.formula, self.metrics.memory.peak_bytes()))
        self.model_printed = True

    def print_comm_totals(self) -> None:
        """`[comm]`: per collective type, what the training steps moved (at exit)."""
        for fields in comm_totals(self.comm_total, max(1, self.steps)):
            emit(self.rank, "comm", fields)
