"""Labs zero3, fp16 and offload: nano's own engine, with lab.py's functions in place of nano's (given).

Some labs are one idea inside a large engine: ZeRO-3's gather and release inside the machinery that
decides which parameters form a unit and when each is needed (zero_lab/nano/unit_gathering.py);
fp16's loss-scale rule inside the step that skips on overflow (zero_lab/nano/zero_optimizer.py);
offload's moves between host and device inside the placement every buffer asks (zero_lab/nano/offload/).
For those, `initialize` is nano's, and lab.py's functions replace nano's own verbs:
    lab zero3   lab.gather_unit(buffer, comm)    before a unit's use: its whole flat buffer
                lab.release_unit(buffer)         after its use: only the partition remains
                (each buffer gathers in a call of its own here; nano may gather several in one call,
                moving the same bytes)
    lab fp16    lab.update_scale(scaler, overflow)   after each step's overflow check
    lab offload lab.host_master_partition(partition)  at start-up: the fp32 master on the host
                lab.copy_master_into_partition(partition, master)  after Adam: back to the device
"""

from __future__ import annotations

from . import lab


def initialize(model, model_parameters, config):
    """nano's `initialize`, with lab.py's functions in place of nano's."""
    import zero_lab.nano as nano

    if hasattr(lab, "gather_unit"):
        from zero_lab.nano.sharded_flat_buffer import BufferState, ShardedFlatBuffer

        def unshard(buffer, collectives, asynchronous=False):
            if buffer.state == BufferState.SHARDED:
                lab.gather_unit(buffer, collectives)
                buffer.state = BufferState.UNSHARDED

        def reshard(buffer):
            if buffer.state == BufferState.UNSHARDED:
                lab.release_unit(buffer)
                buffer.state = BufferState.SHARDED

        ShardedFlatBuffer.gathers_with_others = False
        ShardedFlatBuffer.unshard = unshard
        ShardedFlatBuffer.reshard = reshard
    if hasattr(lab, "update_scale"):
        from zero_lab.nano.loss_scaler import LossScaler

        def update_scale(scaler, overflow):
            if scaler.dynamic:
                lab.update_scale(scaler, overflow)

        LossScaler.update_scale = update_scale
    if hasattr(lab, "host_master_partition"):
        from zero_lab.nano.offload.placement import OffloadPlacement

        def master_for(placement, partition, partition_kind):
            return lab.host_master_partition(partition)

        def copy(placement, destination, source):  # with only the optimizer offloaded: the publish after Adam
            lab.copy_master_into_partition(destination, source)

        OffloadPlacement.master_for = master_for
        OffloadPlacement.copy = copy
    return nano.initialize(model=model, model_parameters=model_parameters, config=config)
