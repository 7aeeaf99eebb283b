"""Lab offload: the optimizer's partitions and Adam's step on the host.

A GPU's memory is small; the host's (the CPU's RAM) is large. With DeepSpeed's
`zero_optimization.offload_optimizer: {device: cpu}` a rank keeps on the host what only Adam reads:
its fp32 master partition, Adam's two states and its fp32 gradient partition, 4 x 4 B x P / N at
stage 2. The device keeps the flat buffer of parameters (what forward and backward compute with).
on_nano.py runs nano's stage-2 engine with the optimizer offloaded; these two functions are the
moves between the two places. One step:
    1. backward: each bucket is reduce-scattered on the device; this rank's averaged share lands in
       its gradient partition on the host (nano's; zero_lab/nano/gradient_reduction.py);
    2. Adam runs on the host, on the master partition, whose states it creates beside it
       (`torch.zeros_like(master)`: where the master is, so on the host too);
    3. `copy_master_into_partition`: the updated master back into the device's partition;
    4. the all-gather sends every rank's device partition into every rank's flat buffer.

On a machine without a GPU host and device are the same memory, but an offloaded tensor still takes
the same path: a copy of its own, moved by the same calls. The check counts the bytes by category:
the fp32 master partition (4 B x P / N) exists only because the optimizer is offloaded.
"""

import torch

LAB = "offload"
STAGE = 2
ON_NANO = True  # engine.py runs nano's stage-2 engine, optimizer offloaded, with these two functions (on_nano.py)
HOST = torch.device("cpu")


def host_master_partition(partition: torch.Tensor) -> torch.Tensor:
    """At start-up, once per flat buffer: the fp32 master partition Adam will update, on the host.

    `partition` is this rank's slice of the flat parameter buffer, on the device. Return a new fp32
    tensor on HOST, with storage of its own, holding the partition's values. Adam's states are
    created like it, so they live on the host too.
    """
    raise NotImplementedError("lab offload: write host_master_partition in lab.py")


def copy_master_into_partition(partition: torch.Tensor, master: torch.Tensor) -> None:
    """After Adam's step on the host, before the all-gather: the updated `master` (fp32, on the
    host) into `partition` (this rank's slice of the device's flat buffer, in the parameters'
    dtype), in place. The all-gather then sends the updated partition to every rank."""
    raise NotImplementedError("lab offload: write copy_master_into_partition in lab.py")
