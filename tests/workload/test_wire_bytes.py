"""Wire bytes per rank follow NCCL-tests' bus-bytes convention, for every name a collective goes by."""

import pytest

from zero_lab.workload.meters.wire_bytes import family, wire_bytes

S = 1200  # bytes of the whole array


@pytest.mark.parametrize("operation, world_size, expected", [
    ("all_reduce", 4, 2 * 3 * S // 4),
    ("all_reduce_coalesced", 2, S),
    ("reduce_scatter", 4, 3 * S // 4),
    ("reduce_scatter_single", 3, 2 * S // 3),
    ("all_gather_into_tensor", 8, 7 * S // 8),
    ("all_to_all_single", 2, S // 2),
    ("broadcast", 4, S),
    ("reduce", 4, S),
    ("all_reduce", 1, 0),
    ("broadcast", 1, 0),
])
def test_the_bus_bytes_factor_of_each_collective(operation, world_size, expected):
    assert wire_bytes(operation, S, world_size) == expected


def test_a_reduce_scatter_and_an_all_gather_move_two_thirds_of_an_all_reduce_and_an_all_gather():
    """ZeRO-2's argument: 2 x (N-1)/N x S on the wire, against 3 x (N-1)/N x S."""
    for world_size in (2, 4, 8):
        zero2 = wire_bytes("reduce_scatter", S, world_size) + wire_bytes("all_gather", S, world_size)
        all_reduce_first = wire_bytes("all_reduce", S, world_size) + wire_bytes("all_gather", S, world_size)
        assert zero2 * 3 == all_reduce_first * 2


def test_every_name_of_a_collective_maps_to_its_family_and_an_unknown_one_is_refused():
    assert family("all_gather_single") == family("all_gather") == "all_gather"
    assert family("reduce_scatter_tensor") == "reduce_scatter"
    with pytest.raises(ValueError, match="unknown collective 'gather'"):
        wire_bytes("gather", S, 2)


def test_one_table_gives_the_family_of_every_name_a_trace_records_and_nccl_tests_bus_factor():
    from zero_lab.analysis.runs import traces
    from zero_lab.workload.meters.wire_bytes import bus_factor, family_of_name

    assert family_of_name("all_gather_into_tensor_coalesced") == "all_gather"
    assert family_of_name("reduce_scatter_tensor_coalesced") == "reduce_scatter"  # not "reduce"
    assert family_of_name("reduce") == "reduce" and family_of_name("barrier") is None
    assert traces.family("barrier") == "barrier" and traces.family("all_reduce_coalesced") == "all_reduce"
    # NCCL-tests' doc/PERFORMANCE.md: all-reduce 2(n-1)/n; all-gather, reduce-scatter, all-to-all (n-1)/n; else 1
    assert [bus_factor(name, 4) for name in ("all_reduce", "all_gather_into_tensor", "reduce_scatter_tensor",
                                             "all_to_all_single", "broadcast", "reduce", "barrier")] == [
        1.5, 0.75, 0.75, 0.75, 1.0, 1.0, 1.0]
    algbw, busbw = traces.bandwidths("all_reduce", 10**9, 1.0, 4)
    assert (algbw, busbw) == (8.0, 12.0)
