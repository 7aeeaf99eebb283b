"""Common mistakes, each planted in a copy of a reference solution: (lab, name) -> the edit that plants it.

Each is a pair of texts: the line of tests/labs/solutions/<lab>.py to replace, and what replaces it.
"""

MISTAKES = {
    # ZeRO-1: the reduce-scatter sums over ranks; forgetting to average leaves every gradient N times too large
    ("zero1", "no_divide"): ("    return partition.div_(comm.world_size)", "    return partition"),
    # ZeRO-2: the full gradients kept after they landed in the bucket
    ("zero2", "keeps_gradients"): ("    parameter.grad = None\n", ""),
    # ZeRO-2: the bucket kept after its reduce-scatter
    ("zero2", "keeps_bucket"): ("        free_storage(group.bucket)\n        group.bucket = None\n", ""),
    # ZeRO-2: the bucket all-reduced whole, and this rank's slice taken from it
    ("zero2", "all_reduce"): (
        "        group.grad_partition = reduce_scatter_gradients(group.bucket, comm)",
        "        comm.all_reduce(group.bucket)\n"
        "        start, end = partition_bounds(group.padded_numel, comm.world_size, comm.rank)\n"
        "        group.grad_partition = group.bucket[start:end].div(comm.world_size)"),
    # ZeRO-3: a unit never released after its use
    ("zero3", "no_release"): ("    buffer.full.untyped_storage().resize_(0)", "    pass"),
    # ZeRO-3: the whole buffer all-reduced (this rank's partition in place, zeros elsewhere) instead of gathered
    ("zero3", "all_reduce"): (
        "    comm.all_gather_into_tensor(buffer.full, buffer.partition)",
        "    buffer.full.zero_()\n"
        "    buffer.full.view(comm.world_size, -1)[comm.rank].copy_(buffer.partition)\n"
        "    comm.all_reduce(buffer.full)"),
    # fp16: the scale halved at the first overflow, the hysteresis ignored
    ("fp16", "no_hysteresis"): ("        if scaler.delayed_shift == 1 or scaler.cur_hysteresis == 1:",
                                "        if True:"),
    # fp16: the good steps since the last overflow counted one too many: the scale grows a step early
    ("fp16", "early_growth"): ("        stable_interval = (scaler.cur_iter - scaler.last_overflow_iter) - 1",
                               "        stable_interval = scaler.cur_iter - scaler.last_overflow_iter"),
    # offload: the partition "moved" to the host with .to(), which returns the partition itself: no master of its own
    ("offload", "master_is_partition"): (
        "    return torch.empty(partition.numel(), dtype=torch.float32, device=HOST).copy_(partition)",
        "    return partition.to(HOST, torch.float32)"),
    # offload: the master rebound to the partition's name, not copied into it: the forward keeps the first weights
    ("offload", "no_copy_back"): ("    partition.copy_(master)", "    partition = master  # noqa: F841"),
}


def planted(solution: str, lab: str, name: str) -> str:
    """The solution's text with the mistake planted (the line must be there exactly once)."""
    old, new = MISTAKES[(lab, name)]
    assert solution.count(old) == 1, (lab, name)
    return solution.replace(old, new)
