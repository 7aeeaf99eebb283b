"""A step's `[warn]` lines, from its loss and whether the engine skipped it; its time on CUDA, queued kernels counted."""

import math

from zero_lab.workload.meters.step_metrics import step_warnings


def test_a_finite_applied_step_warns_nothing():
    assert step_warnings(3, 5.5, 1.0, skipped=False) == []


def test_each_problem_is_its_own_warning():
    assert step_warnings(4, 2.0, 65536.0, skipped=True) == [
        {"step": 4, "kind": "skipped_step", "loss_scale": 65536.0}]
    (loss_warning,) = step_warnings(5, math.inf, 1.0, skipped=False)
    assert loss_warning["kind"] == "non_finite_loss" and loss_warning["loss"] == math.inf
    assert [w["kind"] for w in step_warnings(6, math.nan, 1.0, skipped=True)] == [
        "non_finite_loss", "skipped_step"]


class QueuedDevice:
    """A CUDA device as the host sees it, on a clock of our own: kernels queued at a moment run
    after the ones before them, and `synchronize` returns when the last has run."""

    def __init__(self):
        self.now_ns = 0
        self.busy_until_ns = 0

    def perf_counter_ns(self) -> int:
        return self.now_ns

    def queue(self, kernel_ns: int) -> None:
        self.busy_until_ns = max(self.busy_until_ns, self.now_ns) + kernel_ns

    def synchronize(self, device=None) -> None:
        self.now_ns = max(self.now_ns, self.busy_until_ns)

    def host_work(self, work_ns: int) -> None:
        self.now_ns += work_ns


class HostTimedMeter:
    """A memory meter whose every reading takes host time on the device's clock."""

    def __init__(self, clock: QueuedDevice, reading_ns: int):
        self.clock, self.reading_ns = clock, reading_ns

    def live_bytes(self) -> int:
        self.clock.host_work(self.reading_ns)
        return 0

    def peak_bytes(self) -> int:
        return 0


def test_on_cuda_the_kernels_queued_before_a_sample_count_in_the_step(monkeypatch):
    """Issue 31: the phase sampler took its own wall time away while the forward's kernels were still
    queued, and they ran meanwhile, so step_ms came out low (here 20 ms for 50 ms of kernels). The
    sample now waits for the device first; only the sampling itself (30 ms) is taken away."""
    import torch

    from zero_lab.workload.meters import step_metrics
    from zero_lab.workload.meters.comm_meter import CommMeter

    device = QueuedDevice()
    monkeypatch.setattr(step_metrics.time, "perf_counter_ns", device.perf_counter_ns)
    monkeypatch.setattr(torch.cuda, "synchronize", device.synchronize)
    metrics = step_metrics.StepMetrics(HostTimedMeter(device, reading_ns=30_000_000), CommMeter(),
                                       torch.device("cuda", 0), world_size=1)
    metrics.begin()
    device.queue(50_000_000)  # the forward: queued at once, run by the device over 50 ms
    metrics.sample_phase("after_forward")
    device.queue(20_000_000)  # the backward
    device.host_work(1_000_000)
    assert metrics.elapsed_ns() == 70_000_000
