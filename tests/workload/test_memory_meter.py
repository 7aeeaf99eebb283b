"""The live-storage tracker sees a known allocation, counts shared storage once, and its release."""

import torch

from zero_lab.workload.meters.memory_meter import LiveStorageTracker, MemoryMeter


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


def test_a_storage_resized_to_nothing_is_counted_at_its_size_now():
    """FSDP2's (and nano's) way to free a buffer other references still point to: the storage object
    lives on with 0 bytes. Neither the figure nor the peak may keep its old size."""
    with LiveStorageTracker() as tracker:
        baseline = tracker.live_bytes
        buffer = torch.zeros(1000)  # 4,000 bytes
        still_pointing = buffer[:10]  # keeps the storage object alive
        buffer.untyped_storage().resize_(0)
        assert tracker.live_bytes == baseline
        tracker.reset_peak()
        buffer.untyped_storage().resize_(4000)  # brought back: counted again, and in the peak
        assert tracker.live_bytes - baseline == 4000
        assert tracker.peak_bytes - baseline == 4000
        del buffer, still_pointing
    assert torch.UntypedStorage.resize_ is torch._C.StorageBase.resize_  # the hook leaves with the tracker
