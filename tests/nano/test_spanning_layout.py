"""The bucket spanning whole buffers (`nano.spanning_layout`), against a plain rank-major list (pure: no process group)."""

import random

from zero_lab.nano.layout import FlatLayout
from zero_lab.nano.spanning_layout import SpanningLayout, plan_buckets, spanning_groups


def rank_major(members: list[FlatLayout]) -> list[tuple[int, int]]:
    """The bucket element by element, as (member, flat position): for each rank, each member's
    partition of that rank in turn, the way official's `reduce_scatter_coalesced` lays it out."""
    order = []
    for rank in range(members[0].partition_count):
        for member, layout in enumerate(members):
            start, end = layout.partition_range(rank)
            order += [(member, position) for position in range(start, end)]
    return order


def test_every_element_of_every_member_lands_where_the_rank_major_list_puts_it():
    chance = random.Random(0)
    for _ in range(300):
        world_size = chance.randint(1, 4)
        members = [FlatLayout(tuple(chance.randint(1, 9) for _ in range(chance.randint(1, 3))), world_size,
                              2 * world_size) for _ in range(chance.randint(1, 4))]
        layout = SpanningLayout(tuple(members))
        expected = rank_major(members)
        assert layout.numel == len(expected) == layout.share_numel * world_size
        placed: dict[int, tuple[int, int]] = {}
        for member, flat in enumerate(members):
            start = chance.randint(0, flat.padded_numel - 1)
            numel = chance.randint(1, flat.padded_numel - start)
            for bucket_offset, range_offset, count in layout.positions(member, start, numel):
                for step in range(count):
                    placed[bucket_offset + step] = (member, start + range_offset + step)
            assert sum(count for _, _, count in layout.positions(member, start, numel)) == numel
        for bucket_offset, where in placed.items():
            assert expected[bucket_offset] == where


def test_groups_pack_joining_buffers_in_order_up_to_the_bucket_size():
    # sizes 4, 6, 4, 20 (too large to join), 2; the third buffer does not join
    sizes, joins = [4, 6, 4, 20, 2], [True, True, False, True, True]
    assert spanning_groups(sizes, joins, 10) == [(0, 1), (4,)]  # 4 + 6 fills the bucket exactly
    assert spanning_groups(sizes, joins, 9) == [(0,), (1, 4)]
    assert spanning_groups(sizes, joins, 100) == [(0, 1, 3, 4)]
    assert spanning_groups(sizes, joins, 0) == []  # nothing fits: every buffer keeps its own buckets
    assert spanning_groups(sizes, [False] * 5, 100) == []


def test_the_plan_cuts_every_other_buffer_into_range_buckets_then_adds_the_groups():
    layouts = [FlatLayout((10,), 2, 4), FlatLayout((2,), 2, 4), FlatLayout((7,), 2, 4), FlatLayout((3,), 2, 4)]
    ranges, groups = plan_buckets(layouts, [False, True, False, True], 6)
    # buffers 0 (12 padded) and 2 (8 padded) in buckets of 6, last range first; 1 and 3 (4 each) in two groups
    assert ranges == [(0, 6, 12), (0, 0, 6), (2, 2, 8), (2, 0, 2)]
    assert groups == [(1,), (3,)]
