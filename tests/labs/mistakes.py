"""Each lab's mutants: plausible mistakes, each planted in a copy of the lab's reference solution, that
`zero-lab lab check` must fail with a hint naming the function at fault.

A mutant is a row: the lab, its name, what the mistake is, the line of tests/labs/solutions/<lab>.py it
replaces and with what, the check that must fail first, and the function the hint must name.
docs/labs.md shows the same table (tests/labs/test_lab_inputs.py holds the two equal).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Mutant:
    lab: str
    name: str
    mistake: str  # in a learner's words, for docs/labs.md
    old: str  # the solution's text, exactly once
    new: str
    caught_by: str  # the check that fails first: runs, losses, bytes or wire
    function: str  # the function its hint names
    shows: tuple[str, ...] = ()  # lines the check prints for it (its figures), beyond the hint

    def planted(self, solution: str) -> str:
        """The solution's text with the mistake planted (its line must be there exactly once)."""
        assert solution.count(self.old) == 1, (self.lab, self.name)
        return solution.replace(self.old, self.new)


RANK_SHARE = "    share = padded_numel // world_size\n    return rank * share, (rank + 1) * share"
GATHER = "    comm.all_gather_into_tensor(flat, partition)"
DIVIDE = "    return partition.div_(comm.world_size)"
REDUCE_SCATTER = "    comm.reduce_scatter(partition, flat_gradient, [share] * comm.world_size)"

# ZeRO-1 and ZeRO-2 share partition_bounds, reduce_scatter_gradients and all_gather_parameters.
SHARED = [
    ("no_divide", "the reduce-scatter's sums are not averaged: every gradient is N times too large",
     DIVIDE, "    return partition", "losses", "reduce_scatter_gradients", ("your gradient norm is 2 x nano's",)),
    ("no_copy_back", "the partitions are all-gathered into a new tensor that is never copied into the flat buffer",
     GATHER, "    gathered = torch.empty_like(flat)\n    comm.all_gather_into_tensor(gathered, partition)",
     "losses", "all_gather_parameters"),
    ("reversed_ownership", "rank r owns the slice of rank N-1-r",
     RANK_SHARE, "    share = padded_numel // world_size\n    return (world_size - 1 - rank) * share, "
                 "(world_size - rank) * share", "losses", "partition_bounds"),
    ("uneven_bounds", "the slices split the buffer unevenly: the last rank takes what the others leave",
     RANK_SHARE, "    share = padded_numel // world_size + 1\n    start = rank * share\n"
                 "    return start, padded_numel if rank == world_size - 1 else start + share",
     "runs", "partition_bounds"),
    ("wrong_rank_gradient", "each rank takes the next rank's slice of the reduced gradient",
     REDUCE_SCATTER, "    comm.reduce_scatter(partition, flat_gradient.roll(-share), [share] * comm.world_size)",
     "losses", "reduce_scatter_gradients"),
    ("all_reduce_parameters", "the parameters are all-reduced whole (zeros outside this rank's partition) instead "
                              "of all-gathered",
     GATHER, "    own = partition.clone()\n    flat.zero_()\n"
             "    flat.view(comm.world_size, -1)[comm.rank].copy_(own)\n    comm.all_reduce(flat)",
     "wire", "all_gather_parameters"),
]

MUTANTS = [Mutant(lab, *row) for lab in ("zero1", "zero2") for row in SHARED] + [
    # ZeRO-2: the full gradients kept after they landed in the bucket
    Mutant("zero2", "keeps_gradients", "parameter.grad is kept after it landed in the bucket",
           "    parameter.grad = None\n", "", "losses", "gradient_ready",
           # never released, parameter.grad is never zeroed either: step 2's gradients add onto step 1's
           ("  step 2: gradient norm ", "step 1 agrees and a later step does not: a step's gradients leak into the next")),
    Mutant("zero2", "keeps_bucket", "the bucket is kept after its reduce-scatter",
           "        free_storage(group.bucket)\n        group.bucket = None\n", "", "bytes", "gradient_ready",
           # the padded flat buffer of the gradients, 4 B x P, held into the next step's forward
           ("after_forward: communication_buckets 3,417,600 B, the formula (nano's) 0 B",)),
    Mutant("zero2", "all_reduce", "the bucket is all-reduced whole and this rank's slice taken from it",
           "        group.grad_partition = reduce_scatter_gradients(group.bucket, comm)",
           "        comm.all_reduce(group.bucket)\n"
           "        start, end = partition_bounds(group.padded_numel, comm.world_size, comm.rank)\n"
           "        group.grad_partition = group.bucket[start:end].div(comm.world_size)", "wire", "gradient_ready",
           # the whole bucket all-reduced: 2 (N-1)/N x 4 B x P = 3,417,600 B, plus the gradient norm's 4 B
           ("all_reduce: 3 calls, 3,417,604 wire B per step; nano's 1 calls, 4 B",)),
    # ZeRO-3
    Mutant("zero3", "no_release", "a unit is never released after its use",
           "    buffer.full.untyped_storage().resize_(0)", "    pass", "bytes", "release_unit",
           ("gathered_parameters 3,149,824 B, the formula (nano's) 0 B",)),
    Mutant("zero3", "half_release", "a unit's storage is shrunk to half, not released",
           "    buffer.full.untyped_storage().resize_(0)", "    buffer.full.untyped_storage().resize_(buffer.full_nbytes // 2)",
           "bytes", "release_unit"),
    Mutant("zero3", "all_reduce", "the whole buffer is all-reduced (this rank's partition in place, zeros "
                                  "elsewhere) instead of gathered",
           "    comm.all_gather_into_tensor(buffer.full, buffer.partition)",
           "    buffer.full.zero_()\n"
           "    buffer.full.view(comm.world_size, -1)[comm.rank].copy_(buffer.partition)\n"
           "    comm.all_reduce(buffer.full)", "wire", "gather_unit"),
    Mutant("zero3", "own_partition_only", "only this rank's partition is copied into the unit: nothing is gathered",
           "    comm.all_gather_into_tensor(buffer.full, buffer.partition)",
           "    buffer.full.view(comm.world_size, -1)[comm.rank].copy_(buffer.partition)", "losses", "gather_unit"),
    Mutant("zero3", "gathered_elsewhere", "the unit is gathered into a new tensor, not into buffer.full",
           "    comm.all_gather_into_tensor(buffer.full, buffer.partition)",
           "    gathered = buffer.full.new_empty(buffer.full.shape)\n"
           "    comm.all_gather_into_tensor(gathered, buffer.partition)",
           "losses", "gather_unit"),
    Mutant("zero3", "no_storage", "buffer.full is gathered into before its storage is given back",
           "    buffer.full.untyped_storage().resize_(buffer.full_nbytes)\n", "", "runs", "gather_unit"),
    # fp16: every mistake is in update_scale, DeepSpeed's dynamic loss scaler
    Mutant("fp16", "no_hysteresis", "the scale is halved at the first overflow: the hysteresis is ignored",
           "        if scaler.delayed_shift == 1 or scaler.cur_hysteresis == 1:", "        if True:",
           "losses", "update_scale", ("step 6 (an overflow: skipped): loss scale after the step 131072, nano's 262144",)),
    Mutant("fp16", "early_growth", "the good steps since the last overflow are counted one too many",
           "        stable_interval = (scaler.cur_iter - scaler.last_overflow_iter) - 1",
           "        stable_interval = scaler.cur_iter - scaler.last_overflow_iter", "losses", "update_scale"),
    Mutant("fp16", "no_step_count", "cur_iter is not advanced: the window never passes",
           "    scaler.cur_iter += 1", "    pass", "losses", "update_scale"),
    Mutant("fp16", "overflow_not_recorded", "an overflow's step is not recorded in last_overflow_iter",
           "        scaler.last_overflow_iter = scaler.cur_iter\n", "", "losses", "update_scale"),
    Mutant("fp16", "grows_every_window", "the scale grows on every window boundary, even right after an overflow",
           "        if stable_interval > 0 and stable_interval % scaler.scale_window == 0:",
           "        if stable_interval % scaler.scale_window == 0:", "losses", "update_scale"),
    Mutant("fp16", "hysteresis_spent_twice", "an overflow spends hysteresis down to 0 before it halves the scale",
           "        if scaler.delayed_shift == 1 or scaler.cur_hysteresis == 1:",
           "        if scaler.delayed_shift == 1 or scaler.cur_hysteresis == 0:", "losses", "update_scale"),
    # offload
    Mutant("offload", "master_is_partition", "the master is the partition itself (.to() returns it on the host)",
           "    return torch.empty(partition.numel(), dtype=torch.float32, device=HOST).copy_(partition)",
           "    return partition.to(HOST, torch.float32)", "bytes", "host_master_partition",
           ("after_forward: fp32_master_partition 0 B, the formula (nano's) 1,708,800 B",)),
    Mutant("offload", "master_in_bfloat16", "the master is kept in bfloat16, not float32",
           "    return torch.empty(partition.numel(), dtype=torch.float32, device=HOST).copy_(partition)",
           "    return torch.empty(partition.numel(), dtype=torch.bfloat16, device=HOST).copy_(partition)",
           "runs", "host_master_partition"),
    Mutant("offload", "master_starts_at_zero", "the master is a new tensor of zeros: the partition's values are "
                                               "never copied into it",
           "    return torch.empty(partition.numel(), dtype=torch.float32, device=HOST).copy_(partition)",
           "    return torch.zeros(partition.numel(), dtype=torch.float32, device=HOST)",
           "losses", "host_master_partition"),
    Mutant("offload", "no_copy_back", "the master is bound to the partition's name, not copied into it",
           "    partition.copy_(master)", "    partition = master  # noqa: F841", "losses",
           "copy_master_into_partition"),
    Mutant("offload", "first_element_missed", "the copy back starts one element late",
           "    partition.copy_(master)", "    partition[1:].copy_(master[1:])", "losses", "copy_master_into_partition"),
    Mutant("offload", "copied_backwards", "the partition is copied into the master: Adam's update is undone",
           "    partition.copy_(master)", "    master.copy_(partition)", "losses", "copy_master_into_partition"),
]

BY_NAME = {(mutant.lab, mutant.name): mutant for mutant in MUTANTS}


def planted(solution: str, lab: str, name: str) -> str:
    """The solution's text with the mistake planted (the line must be there exactly once)."""
    return BY_NAME[(lab, name)].planted(solution)


def mutants_of(lab: str) -> list[Mutant]:
    return [mutant for mutant in MUTANTS if mutant.lab == lab]
