"""ZeRO stage 1: stage 0 with the optimizer partitioned.

The diff from stage 0: each rank owns 1/world_size of the flat buffer. Its fp32 master partition,
optimizer states and fp32 gradient partition cover only that slice. Gradients still accumulate in
full-size `param.grad` during backward (stage 1 partitions optimizer states, not gradients); at the
boundary each bucket is packed into a buffer and reduce-scattered (or all-reduced and scattered
back, with `reduce_scatter: false`) so each rank keeps only its partition's average. After Adam
updates the partition, the parameters are all-gathered (bucketed by `allgather_bucket_size`).
"""

from __future__ import annotations

from zero_lab.nano.stage0 import Stage0Optimizer


class Stage1Optimizer(Stage0Optimizer):
    stage = 1
    partitioned = True
