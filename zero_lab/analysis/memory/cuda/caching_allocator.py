"""What CUDA's caching allocator reserves for a sequence of allocations and frees: its rules
(torch's c10/cuda/CUDACachingAllocator.cpp, at its defaults: no expandable segments, no
max_split_size, no rounding to powers of two) applied to a rank's tensors in the order it made them.

The rules:
    rounding:   a request is rounded up to a multiple of 512 bytes;
    pools:      up to 1 MiB it is served from the small pool, in 2 MiB segments; above, from the
                large pool, in 20 MiB segments up to 10 MiB and alone in a segment rounded up to
                2 MiB beyond;
    reuse:      the smallest free block of the request's pool and stream that is large enough;
                a larger block is split when what is left is 512 bytes or more (small pool) or
                more than 1 MiB (large pool); only a new segment when none is large enough;
    free:       a freed block merges with its free neighbours in its segment and stays cached:
                a segment goes back to the device only at `empty_cache` (when every block of it is
                free) or when an allocation fails, which a run that fits never reaches.
Reserved is the sum of the segments; it only grows.

Phase 1: `allocate(key, bytes, stream)`, `free(key)` and `empty_cache()` replay the events, in order.
Phase 2: `peak_reserved`, `peak_allocated` and what was reserved at that moment are read at the end
         (allocated counts rounded blocks, as `torch.cuda.max_memory_allocated` does).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

MIN_BLOCK = 512
SMALL_SIZE = 2**20  # largest request of the small pool
SMALL_BUFFER = 2 * 2**20  # a small pool's segment
MIN_LARGE_ALLOC = 10 * 2**20  # requests below it share a LARGE_BUFFER segment
LARGE_BUFFER = 20 * 2**20
ROUND_LARGE = 2 * 2**20  # a larger request's own segment is rounded up to it


def rounded(nbytes: int) -> int:
    """A request's block size: at least 512 bytes, a multiple of 512."""
    return max(MIN_BLOCK, -(-nbytes // MIN_BLOCK) * MIN_BLOCK)


def segment_size(size: int) -> int:
    """The segment a request of `size` (rounded) makes when no cached block serves it."""
    if size <= SMALL_SIZE:
        return SMALL_BUFFER
    if size < MIN_LARGE_ALLOC:
        return LARGE_BUFFER
    return -(-size // ROUND_LARGE) * ROUND_LARGE


@dataclass(eq=False)
class Block:
    """A piece of a segment: allocated or free, with its neighbours in the segment (address order)."""

    size: int
    stream: int
    small: bool
    address: int
    free: bool = True
    before: "Block | None" = field(default=None, repr=False)
    after: "Block | None" = field(default=None, repr=False)

    def sort_key(self) -> tuple[int, int, int]:
        return (self.stream, self.size, self.address)


class CachingAllocatorModel:
    """The allocator's segments and blocks over a replay of one rank's allocations (the module docstring)."""

    def __init__(self) -> None:
        self.free_blocks = {True: [], False: []}  # small pool?: [(sort key, block)], sorted
        self.allocated_blocks: dict[object, Block] = {}
        self.reserved = 0
        self.peak_reserved = 0
        self.reserved_at_peak_allocated = 0  # reserved when the tensors peaked: the free part is cached beside them
        self.allocated = 0
        self.peak_allocated = 0
        self.next_address = 0
        self.segments: dict[int, tuple[int, str]] = {}  # address -> (bytes, what asked for it), of the segments held

    def allocate(self, key, nbytes: int, stream: int = 0, origin: str = "") -> None:
        """Phase 1: a tensor of `nbytes` made on `stream` (its storage's identity: `key`; `origin`: where
        it was made, kept with the segment it makes); 0 bytes take no block."""
        if nbytes <= 0:
            return
        size = rounded(nbytes)
        small = size <= SMALL_SIZE
        block = self._take_free(size, stream, small) or self._new_segment(size, stream, small, origin)
        remaining = block.size - size
        if remaining >= MIN_BLOCK if small else remaining > SMALL_SIZE:
            rest = Block(remaining, stream, small, block.address + size, before=block, after=block.after)
            if block.after is not None:
                block.after.before = rest
            block.after, block.size = rest, size
            self._put_free(rest)
        block.free = False
        self.allocated_blocks[key] = block
        self.allocated += block.size
        if self.allocated > self.peak_allocated:
            self.peak_allocated, self.reserved_at_peak_allocated = self.allocated, self.reserved

    def free(self, key) -> None:
        """Phase 1: the tensor `key` freed: its block merges with free neighbours and stays cached."""
        block = self.allocated_blocks.pop(key, None)
        if block is None:
            return
        self.allocated -= block.size
        block.free = True
        for neighbour in (block.before, block.after):
            if neighbour is not None and neighbour.free:
                self._remove_free(neighbour)
                first, second = (neighbour, block) if neighbour is block.before else (block, neighbour)
                first.size += second.size
                first.after = second.after
                if second.after is not None:
                    second.after.before = first
                block = first
        self._put_free(block)

    def empty_cache(self) -> None:
        """Phase 1: every segment that is one free block goes back to the device."""
        for small, pool in self.free_blocks.items():
            whole = [entry for entry in pool if entry[1].before is None and entry[1].after is None]
            self.free_blocks[small] = [entry for entry in pool
                                       if entry[1].before is not None or entry[1].after is not None]
            self.reserved -= sum(entry[1].size for entry in whole)
            for _, block in whole:
                del self.segments[block.address]

    def _take_free(self, size: int, stream: int, small: bool) -> Block | None:
        pool = self.free_blocks[small]
        index = bisect.bisect_left(pool, (stream, size, -1), key=lambda entry: entry[0])
        if index == len(pool) or pool[index][1].stream != stream:
            return None
        return pool.pop(index)[1]

    def _new_segment(self, size: int, stream: int, small: bool, origin: str) -> Block:
        allocation = segment_size(size)
        self.reserved += allocation
        self.peak_reserved = max(self.peak_reserved, self.reserved)
        self.segments[self.next_address] = (allocation, origin)
        block = Block(allocation, stream, small, self.next_address)
        self.next_address += allocation
        return block

    def _put_free(self, block: Block) -> None:
        bisect.insort(self.free_blocks[block.small], (block.sort_key(), block), key=lambda entry: entry[0])

    def _remove_free(self, block: Block) -> None:
        pool = self.free_blocks[block.small]
        index = bisect.bisect_left(pool, block.sort_key(), key=lambda entry: entry[0])
        assert pool[index][1] is block
        pool.pop(index)


def pool_bytes(sizes: list[int]) -> int:
    """What one stream's pool reserves for tensors of `sizes` alive together."""
    allocator = CachingAllocatorModel()
    for key, size in enumerate(sizes):
        allocator.allocate(key, size)
    return allocator.reserved
