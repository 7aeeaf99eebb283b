"""The live-storage tracker sees a known allocation, counts shared storage once, and its release."""

import torch

from zero_lab.workload.memory_meter import LiveStorageTracker, MemoryMeter


def test_tracker_sees_an_allocation_and_its_release():
    with LiveStorageTracker() as tracker:
        baseline = tracker.live_bytes
        block = torch.empty(1_000_000)  # 4,000,000 bytes
        view = block[10:20].view(2, 5)  # shares block's storage: no new bytes
        assert tracker.live_bytes - baseline == 4_000_000
        del block, view
        assert tracker.live_bytes == baseline
        assert tracker.peak_bytes - baseline >= 4_000_000


def test_peak_is_the_high_water_mark_since_the_last_reset():
    with LiveStorageTracker() as tracker:
        first = torch.zeros(250_000)  # 1,000,000 bytes
        del first
        tracker.reset_peak()
        baseline = tracker.live_bytes
        second = torch.zeros(125_000)  # 500,000 bytes
        assert tracker.peak_bytes - baseline == 500_000
        del second


def test_resize_in_place_is_followed():
    with LiveStorageTracker() as tracker:
        grown = torch.zeros(10)
        baseline = tracker.live_bytes
        grown.resize_(1000)  # the same storage, now 4,000 bytes
        assert tracker.live_bytes - baseline == 4000 - 40


def test_meter_samples_cpu_memory_and_resets_peaks():
    meter = MemoryMeter(torch.device("cpu"))
    meter.start()
    try:
        before = meter.sample()
        block = torch.ones(2_000_000)  # 8,000,000 bytes, touched so resident
        during = meter.sample()
        del block
        after = meter.sample()  # the block was alive when this window began
        quiet = meter.sample()  # nothing happened in this window
    finally:
        meter.stop()
    assert during.alloc - before.alloc == 8_000_000
    assert during.peak_alloc >= during.alloc and during.peak_reserved >= during.reserved > 0
    assert after.alloc == before.alloc
    assert after.peak_alloc == during.alloc
    assert quiet.peak_alloc == quiet.alloc == before.alloc  # an earlier peak does not linger
