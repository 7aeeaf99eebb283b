"""The caching allocator's model (zero_lab/analysis/memory/cuda/caching_allocator.py) follows the rules torch's
documentation and c10/cuda/CUDACachingAllocator.cpp state: requests rounded to 512 bytes, a small pool of
2 MiB segments up to 1 MiB, 20 MiB segments up to 10 MiB, a segment of its own (rounded to 2 MiB) beyond,
the smallest cached block that fits reused and split, freed blocks merged and kept, one pool per stream."""

from zero_lab.analysis.memory.cuda.caching_allocator import CachingAllocatorModel

MiB = 2**20


def replayed(*events) -> CachingAllocatorModel:
    """events: (key, bytes) to allocate, (key, None) to free, (key, bytes, stream) on another stream."""
    allocator = CachingAllocatorModel()
    for event in events:
        if event[1] is None:
            allocator.free(event[0])
        else:
            allocator.allocate(*event)
    return allocator


def test_a_request_is_rounded_to_512_bytes_and_a_small_one_takes_a_2_mib_segment():
    allocator = replayed(("a", 1000))
    assert (allocator.allocated, allocator.reserved) == (1024, 2 * MiB)
    assert replayed(("a", 1)).allocated == 512 and replayed(("a", 0)).reserved == 0


def test_requests_up_to_10_mib_share_a_20_mib_segment_and_larger_ones_take_their_own():
    assert replayed(("a", 3 * MiB), ("b", 3 * MiB), ("c", 3 * MiB)).reserved == 20 * MiB
    assert replayed(("a", 11 * MiB + 1)).reserved == 12 * MiB
    assert replayed(("a", 1 * MiB), ("b", 1 * MiB + 512)).reserved == 2 * MiB + 20 * MiB  # two pools


def test_a_freed_block_serves_a_smaller_request_but_never_a_larger_one():
    assert replayed(("a", 100 * MiB), ("a", None), ("b", 50 * MiB)).reserved == 100 * MiB
    assert replayed(("a", 50 * MiB), ("a", None), ("b", 100 * MiB)).reserved == 150 * MiB


def test_freed_neighbours_merge_so_their_segment_serves_their_sum():
    two_halves = replayed(("a", 60 * MiB), ("a", None), ("b", 30 * MiB), ("c", 30 * MiB), ("b", None), ("c", None),
                          ("d", 60 * MiB))
    assert two_halves.reserved == 60 * MiB
    # in two segments of their own, two freed blocks cannot serve their sum
    apart = replayed(("a", 30 * MiB), ("b", 30 * MiB), ("a", None), ("b", None), ("c", 60 * MiB))
    assert apart.reserved == 120 * MiB


def test_the_smallest_block_that_fits_is_reused():
    allocator = replayed(("a", 40 * MiB), ("b", 80 * MiB), ("a", None), ("b", None), ("c", 30 * MiB), ("d", 70 * MiB))
    assert allocator.reserved == 120 * MiB  # c splits the 40, d the 80: no new segment


def test_a_large_block_is_split_only_when_more_than_1_mib_is_left():
    # 12 MiB left of a 22 MiB segment after 10 MiB: split, and the rest serves an 11 MiB request
    assert replayed(("a", 22 * MiB), ("a", None), ("b", 10 * MiB), ("c", 11 * MiB)).reserved == 22 * MiB
    # 1 MiB left stays in the block, allocated with it; the next request needs a segment of its own
    unsplit = replayed(("a", 22 * MiB), ("a", None), ("b", 21 * MiB))
    assert unsplit.allocated == 22 * MiB
    unsplit.allocate("c", 11 * MiB - 1)
    assert unsplit.reserved == 22 * MiB + 12 * MiB


def test_each_stream_has_its_own_cached_blocks():
    assert replayed(("a", 30 * MiB, 0), ("a", None), ("b", 30 * MiB, 1)).reserved == 60 * MiB
    assert replayed(("a", 30 * MiB, 1), ("a", None), ("b", 30 * MiB, 1)).reserved == 30 * MiB


def test_reserved_never_shrinks_and_the_peak_counts_the_rounded_blocks():
    allocator = replayed(("a", 50 * MiB + 1), ("b", 3 * MiB), ("a", None), ("b", None))
    assert allocator.allocated == 0 and allocator.reserved == 52 * MiB + 20 * MiB
    assert allocator.peak_allocated == 50 * MiB + 512 + 3 * MiB


def test_empty_cache_returns_the_segments_that_are_wholly_free():
    allocator = replayed(("a", 30 * MiB), ("b", 3 * MiB), ("c", 3 * MiB), ("a", None), ("b", None))
    allocator.empty_cache()
    assert allocator.reserved == 20 * MiB  # the 20 MiB segment still holds c
    allocator.allocate("d", 30 * MiB)
    assert allocator.reserved == 50 * MiB
