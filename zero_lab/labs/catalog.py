"""The labs, in course order: what each asks the learner to write, the formula it must meet, its hints.

A lab is a row here; `start` writes its package from it and `check` holds the learner's engine to
it. The functions to write live in zero_lab/labs/todo/<lab>.py (each raises NotImplementedError
naming the lab); the engine around them is zero_lab/labs/skeleton/ (it runs stage 0 as it is).
"""

from __future__ import annotations

from dataclasses import dataclass, field

LEAKING_GRADIENTS = ("step 1 agrees and a later step does not: a step's gradients leak into the next (autograd adds "
                     "into parameter.grad): release parameter.grad once it is used")


# ZeRO-1 and ZeRO-2 share three functions, and so the evidence of their mistakes.
ZERO1_EVIDENCE = {
    "moved_at_zero_lr": "partition_bounds: at a learning rate of 0 no parameter may change, yet after the all-gather "
                        "yours did: a partition came back to another rank's place. Rank r owns [r x P/N, (r+1) x P/N), "
                        "the r-th slice, which all_gather_into_tensor fills from rank r",
    "did_not_move": "all_gather_parameters: the update reached this rank's own partition only, the others' parameters "
                    "stayed as they were: gather into flat itself (all_gather_into_tensor(flat, partition)), not into "
                    "a new tensor",
    "moved_differently": "reduce_scatter_gradients: the gradient norm agrees but the update does not, so Adam updated "
                         "this rank's partition with another slice's gradient: return the rank-th slice the "
                         "reduce-scatter gives, [start, end) of partition_bounds, divided by the world size",
    "size_mismatch": "partition_bounds: every rank's slice must hold padded_numel // world_size elements, the size of "
                     "the partition reduce_scatter_gradients returns: rank r owns [r x P/N, (r+1) x P/N)",
}
PARTITIONED_COLLECTIVES = {"reduce_scatter": "reduce_scatter_gradients", "all_gather_single": "all_gather_parameters"}


@dataclass(frozen=True)
class Lab:
    """One lab: its name, the stage its engine runs, and what the learner reads."""

    name: str
    title: str
    stage: int
    goal: str
    functions: tuple[str, ...]  # in the order the engine first calls them
    formula: str  # the bytes a correct engine holds and sends, per rank (P: padded parameters, N: ranks)
    hints: tuple[str, ...]
    lesson: str  # the course's lesson that explains it (docs/learn/)
    dtype: str = "float32"  # the workload's --dtype
    seq_len: int | None = None  # the workload's --seq-len (None: the harness's default)
    config: dict = field(default_factory=dict)  # merged into the harness's zero<stage>.json, section by section
    # optimizer steps per run: enough to meet every moment the lab is about, and for the losses to show
    # 3 real updates (the harness's learning rate is 0 for updates 1 and 2: analysis.runs.updates)
    steps: int = 6
    later_step_hint: str = LEAKING_GRADIENTS  # when step 1's gradient norm agrees and a later step's does not
    # the mistake named by its evidence (zero_lab/labs/check.py): the parameters after a step moved at
    # learning rate 0, did not move, or moved differently; the run stopped on tensors of unequal sizes
    evidence_hints: dict = field(default_factory=dict)
    # which function issues each collective: a collective short of nano's wire bytes names it
    function_of_collective: dict = field(default_factory=dict)
    compare_options: str = ""  # what `zero-lab compare` needs beyond --stages to run the lab's moment (its README)


LABS = (
    Lab("zero1", "ZeRO-1: partition the Adam states, all-gather the parameters after the step", 1,
        "Each rank updates only its partition of the parameters, so it holds only its partition of Adam's "
        "states; after the step every rank gathers the others' updated partitions.",
        ("partition_bounds", "reduce_scatter_gradients", "all_gather_parameters"),
        "optimizer states 2 x 4 B x P / N; parameters 4 B x P; gradients 4 B x numel after backward. "
        "Wire per step: reduce-scatter (N-1)/N x 4 B x P, all-gather (N-1)/N x 4 B x P, and the 4 B "
        "all-reduce of the gradient norm the engine makes",
        ("reduce_scatter_gradients: a reduce-scatter sums; divide the partition by the world size, or every "
         "gradient is N times too large.",
         "partition_bounds: rank r owns [r x P/N, (r+1) x P/N); Adam's states take the size of what partition_bounds "
         "returns.",
         "all_gather_parameters: all_gather_into_tensor(flat, partition) fills the whole buffer from every rank's "
         "partition; an all-reduce of the whole buffer moves twice the bytes."),
        "docs/learn/2-zero-1.md",
        later_step_hint="step 1's gradient norm agrees and a later one does not, from the same parameters: "
                        "reduce_scatter_gradients must reduce only the flat gradient it is given, into a new "
                        "partition, and keep nothing from one step to the next",
        evidence_hints=ZERO1_EVIDENCE,
        function_of_collective=PARTITIONED_COLLECTIVES),
    Lab("zero2", "ZeRO-2: reduce-scatter the gradients into partitions during backward, in buckets", 2,
        "As backward produces each gradient it goes into a bucket; a full bucket is reduce-scattered, so each "
        "rank keeps only its gradient partition, never the full gradients.",
        ("partition_bounds", "reduce_scatter_gradients", "all_gather_parameters", "gradient_ready"),
        "after backward: gradient partition 4 B x P / N and no full gradients; optimizer states 2 x 4 B x P / N. "
        "Wire per step: as ZeRO-1 (reduce-scatter and all-gather, (N-1)/N x 4 B x P each)",
        ("reduce_scatter_gradients: a reduce-scatter sums; divide the partition by the world size, or every "
         "gradient is N times too large.",
         "gradient_ready: release parameter.grad as soon as it is in the bucket: ZeRO-2 holds no full gradients "
         "after backward.",
         "gradient_ready: reduce-scatter the bucket (not all-reduce it): each rank needs only its partition's sums.",
         "gradient_ready: release the bucket once its partition is taken: free its storage (free_storage), then "
         "drop it."),
        "docs/learn/3-zero-2.md",
        later_step_hint="step 1 agrees and a later step does not: a step's gradients leak into the next (autograd "
                        "adds into parameter.grad): gradient_ready must release parameter.grad once it is in the "
                        "bucket",
        evidence_hints=ZERO1_EVIDENCE,
        function_of_collective={**PARTITIONED_COLLECTIVES, "reduce_scatter": "gradient_ready"}),
    Lab("zero3", "ZeRO-3: gather each unit before its forward and backward, and release it after", 3,
        "Each rank keeps only its partition of every parameter; a unit is gathered whole just before its forward "
        "and its backward need it, and released right after.",
        ("gather_unit", "release_unit"),
        "parameters 4 B x P / N between uses (persistent small parameters whole) and optimizer states "
        "2 x 4 B x P / N; no gathered parameters after forward's last unit, after backward and after the step. "
        "Wire per step: all-gathers of (N-1)/N of each unit per use, and a reduce-scatter of (N-1)/N x 4 B x P",
        ("gather_unit: gather every rank's partition into buffer.full itself: all_gather_into_tensor(buffer.full, "
         "buffer.partition) sends (N-1)/N of the buffer, an all-reduce of it twice that.",
         "gather_unit: give buffer.full its storage back before gathering into it "
         "(untyped_storage().resize_(buffer.full_nbytes)).",
         "release_unit: release after use, all of it (resize the storage of buffer.full to 0): a unit left whole "
         "holds 4 B x its padded size on every rank until the next step."),
        "docs/learn/4-zero-3.md",
        evidence_hints={"no_storage": "gather_unit: buffer.full has no storage between uses: give it back "
                                      "(untyped_storage().resize_(buffer.full_nbytes)) before gathering into it"},
        function_of_collective={"all_gather_single": "gather_unit"}),
    Lab("fp16", "Mixed precision: fp16 with dynamic loss scaling that skips a step on overflow, as DeepSpeed does", 2,
        "The loss is scaled up before backward so that small fp16 gradients survive; a step whose gradients "
        "overflow is skipped and the scale shrinks, after enough good steps it grows again.",
        ("update_scale",),
        "the loss scale after every step equal to DeepSpeed's rule: from 2^16, doubled after every 2 good steps "
        "(loss_scale_window 2), an overflow first spending one of 2 units of hysteresis, then halving; the "
        "same steps skipped; bytes and wire bytes of nano's stage 2 in fp16",
        ("update_scale: count every step in cur_iter, skipped or not: the window is measured from the last "
         "overflow.",
         "update_scale: an overflow spends hysteresis before it shrinks the scale: with hysteresis 2 the first "
         "overflow leaves the scale as it is.",
         "update_scale: grow the scale only after loss_scale_window good steps since the last overflow (record "
         "the overflow's step in last_overflow_iter)."),
        "docs/learn/5-precision.md", dtype="float16",
        config={"fp16": {"enabled": True, "loss_scale": 0, "initial_scale_power": 16, "loss_scale_window": 2,
                         "hysteresis": 2, "min_loss_scale": 1}},
        # 9: the tiny workload overflows at steps 6 and 7, so the rule is seen spending its hysteresis, halving,
        # and counting the good steps after an overflow (tests/labs/mistakes.py: a mistake in each); 32 tokens
        # a sample overflow at the same steps as the default 128, and fp16's matmuls, which a CPU emulates, cost
        # a quarter
        steps=9, seq_len=32, compare_options="--dtype float16 --seq-len 32"),
    Lab("offload", "Offload: the optimizer states and step on the host", 2,
        "What only Adam reads lives on the host: the fp32 master partition, Adam's two states and the gradient "
        "partition. Each step the reduced gradient partition lands on the host, Adam runs there, and the updated "
        "master is copied back into the device's partition before the all-gather.",
        ("host_master_partition", "copy_master_into_partition"),
        "on the host: fp32 master partition 4 B x P / N (a copy of its own: without offload the partition is "
        "its own master), optimizer states 2 x 4 B x P / N, gradient partition 4 B x P / N after backward; on "
        "the device: parameters 4 B x P. Wire per step: as ZeRO-2 (reduce-scatter and all-gather, (N-1)/N x "
        "4 B x P each); host and device copies are not on the wire",
        ("host_master_partition: the master is a copy of its own on the host: partition.to('cpu', torch.float32) "
         "returns the partition itself when it is already there; clone it.",
         "copy_master_into_partition: Adam updates the master on the host, not the partition the forward reads: "
         "copy the master into the partition after every step, or every rank computes with the weights it "
         "started with.",
         "copy_master_into_partition: copy in place (partition.copy_(master)): rebinding a name inside the "
         "function changes no tensor."),
        "docs/learn/6-offload.md",
        config={"zero_optimization": {"offload_optimizer": {"device": "cpu"}}},
        later_step_hint="the first steps agree and a later one does not: Adam changed the master on the host but not "
                        "the parameters the forward reads. copy_master_into_partition must copy the master into the "
                        "partition in place after every step (partition.copy_(master)); rebinding a name changes no "
                        "tensor",
        evidence_hints={
            "moved_at_zero_lr": "host_master_partition: at a learning rate of 0 no parameter may change, yet the "
                                "master copied back changed yours: the master must start as an exact fp32 copy of "
                                "the partition's values",
            "did_not_move": "copy_master_into_partition: Adam moved the master on the host, but your parameters "
                            "stayed where they were: copy the master into the partition in place "
                            "(partition.copy_(master)); rebinding a name or .data changes no tensor the forward reads",
            "moved_differently": "copy_master_into_partition: your parameters moved, but not to the master's values: "
                                 "copy the whole master into the partition, in place, after every step",
            "wrong_dtype": "host_master_partition: Adam's states are float32, so the master must be too: a new "
                           "float32 tensor on the host holding the partition's values"},
        compare_options="--offload optimizer"),
)

BY_NAME = {lab.name: lab for lab in LABS}


def lab_named(name: str) -> Lab | None:
    return BY_NAME.get(name)
