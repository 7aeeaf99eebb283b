"""One optimizer step's figures, combined over ranks into the `[opt_step k]` line.

Phase 1: `begin()` notes the time and the communication counts.
Phase 2: the caller runs the step's micro-steps, hands each micro-step's loss to `add_loss`, and
         in the last micro-step calls `sample_phase` after the forward, the backward and
         `engine.step()` (`phase_memory.PHASES`). Live bytes after the backward are nano's formula
         at its "backward" moment (parameters, optimizer states, and gradients: full param.grad
         at stages 0/1, the gradient partition at stage 2); at the end of the step they are its
         "between_steps" moment (no gradient buffer).
Phase 3: `end()` samples this rank's memory, then (with the comm meter paused, so the harness's
         own collectives never count) averages the loss over micro-steps and ranks (SUM, then
         divide: gloo's AVG has had silent bugs) and takes the max over ranks of memory, step
         time and communication bytes.

The step's CPU time (`step_cpu_ms`) is the CPU time of the rank's whole process over the same span
(every thread: the training loop's and the communication backend's), its samples' taken away too:
what the rank computed, not what it waited for (a rank waiting on a collective or on other work of
the machine spends wall time, not CPU time).

The step time is wall time from `begin()` to `end()` less the time the phase samples take. On CUDA
the host runs ahead of the device: when a sample starts, kernels of the phase before it may still
be queued, and they run while the host samples. So each sample, like `end()`, first waits for the
device (`wait_for_device`); only then is the sampling's own time taken away, and no device work is
taken away with it.
"""

from __future__ import annotations

import math
import time

import torch
import torch.distributed as dist

from zero_lab.workload.meters.comm_meter import CommMeter, OpCount, difference
from zero_lab.workload.log_contract.log_lines import MB
from zero_lab.workload.meters.memory_meter import MemoryMeter
from zero_lab.workload.meters.phase_memory import PhaseSample, visible_categories

MAX_OVER_RANKS = ("alloc", "reserved", "peak_alloc", "peak_reserved", "pre_step_alloc",
                  "comm_bytes", "comm_wire_bytes", "comm_wire_intra_bytes", "comm_wire_inter_bytes", "step_ns",
                  "step_cpu_ns")


class StepMetrics:
    def __init__(self, memory: MemoryMeter, comm: CommMeter, device: torch.device, world_size: int):
        self.memory = memory
        self.comm = comm
        self.device = device
        self.world_size = world_size

    def begin(self) -> None:
        self._losses: list[torch.Tensor] = []
        self.phases: list[PhaseSample] = []
        self._comm_before = self.comm.snapshot()
        self._started = time.perf_counter_ns()
        self._cpu_started = time.process_time_ns()

    def add_loss(self, loss: torch.Tensor) -> None:
        self._losses.append(loss.detach().float())

    def sample_phase(self, phase: str, memory_breakdown=None) -> None:
        """This rank's live bytes and the peak so far at a phase boundary, with nano's categories
        when `memory_breakdown` (nano's engine method) is given; the time this takes is not the step's."""
        self.wait_for_device()  # the phase's queued kernels are the step's time, not the sample's
        started, cpu_started = time.perf_counter_ns(), time.process_time_ns()
        categories = visible_categories(memory_breakdown(by_device=True), self.device.type) if memory_breakdown else {}
        self.phases.append(PhaseSample(phase, self.memory.live_bytes(), self.memory.peak_bytes(), categories))
        self._started += time.perf_counter_ns() - started
        self._cpu_started += time.process_time_ns() - cpu_started

    def wait_for_device(self) -> None:
        """Wait until the device has run every kernel queued so far (nothing to wait for on CPU)."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def elapsed_ns(self) -> int:
        """The step's time so far: since `begin()`, the device's queued work included, less the samples'."""
        self.wait_for_device()
        return time.perf_counter_ns() - self._started

    def pre_step_alloc(self) -> int:
        """Live bytes after the last backward, before `engine.step()`."""
        return next(sample.live_bytes for sample in reversed(self.phases) if sample.phase == "after_backward")

    def end(self, tokens: int) -> dict:
        """Fields of the step's line (before loss_scale, lr and grad_norm, which the engine knows)."""
        step_ns = self.elapsed_ns()
        step_cpu_ns = time.process_time_ns() - self._cpu_started
        memory = self.memory.sample()
        moved = difference(self.comm.snapshot(), self._comm_before).values()
        comm_bytes = sum(count.bytes for count in moved)
        comm_wire_bytes = sum(count.wire_bytes for count in moved)
        local_max = [memory.alloc, memory.reserved, memory.peak_alloc, memory.peak_reserved,
                     self.pre_step_alloc(), comm_bytes, comm_wire_bytes,
                     sum(count.wire_intra_bytes for count in moved), sum(count.wire_inter_bytes for count in moved),
                     step_ns, step_cpu_ns]
        with self.comm.paused():
            loss_sum = torch.stack(self._losses).sum().to(torch.float64).reshape(1)
            maxima = torch.tensor(local_max, dtype=torch.int64, device=self.device)
            if self.world_size > 1:
                dist.all_reduce(loss_sum, op=dist.ReduceOp.SUM)
                dist.all_reduce(maxima, op=dist.ReduceOp.MAX)
        worst = dict(zip(MAX_OVER_RANKS, maxima.tolist()))
        step_s = worst["step_ns"] / 1e9
        return {
            "loss": loss_sum.item() / (len(self._losses) * self.world_size),
            "step_ms": step_s * 1e3,
            "tokens_per_s": tokens / step_s,
            "step_cpu_ms": worst["step_cpu_ns"] / 1e6,
            "alloc_max_mb": worst["alloc"] / MB,
            "reserved_max_mb": worst["reserved"] / MB,
            "peak_alloc_max_mb": worst["peak_alloc"] / MB,
            "peak_reserved_max_mb": worst["peak_reserved"] / MB,
            "comm_mb": worst["comm_bytes"] / MB,
            "comm_wire_mb": worst["comm_wire_bytes"] / MB,
            "comm_wire_intra_mb": worst["comm_wire_intra_bytes"] / MB,
            "comm_wire_inter_mb": worst["comm_wire_inter_bytes"] / MB,
            "pre_step_alloc_max_mb": worst["pre_step_alloc"] / MB,
            "alloc_max_bytes": worst["alloc"],
            "pre_step_alloc_max_bytes": worst["pre_step_alloc"],
            "comm_bytes": worst["comm_bytes"],
            "comm_wire_bytes": worst["comm_wire_bytes"],
            "comm_wire_intra_bytes": worst["comm_wire_intra_bytes"],
            "comm_wire_inter_bytes": worst["comm_wire_inter_bytes"],
        }


def comm_totals(counts: dict[str, OpCount], steps: int) -> list[dict]:
    """Fields of the `[comm]` lines: one per collective type, over all training steps."""
    return [{"op": name, "calls": count.calls, "mb": count.bytes / MB, "bytes": count.bytes,
             "bytes_per_step": count.bytes // steps, "wire_mb": count.wire_bytes / MB,
             "wire_bytes": count.wire_bytes, "wire_bytes_per_step": count.wire_bytes // steps,
             "wire_intra_bytes_per_step": count.wire_intra_bytes // steps,
             "wire_inter_bytes_per_step": count.wire_inter_bytes // steps}
            for name, count in sorted(counts.items())]


def step_warnings(step: int, loss: float, loss_scale: float, skipped: bool) -> list[dict]:
    """Fields of a step's `[warn]` lines: a non-finite loss, and a step the engine skipped.

    Both engines count skipped steps in `engine.skipped_steps` (official: fp16 overflow; nano: a
    non-finite global gradient norm in any precision), so `skipped` is that count having grown.
    """
    warnings = []
    if not math.isfinite(loss):
        warnings.append({"step": step, "kind": "non_finite_loss", "loss": loss})
    if skipped:
        warnings.append({"step": step, "kind": "skipped_step", "loss_scale": loss_scale})
    return warnings
