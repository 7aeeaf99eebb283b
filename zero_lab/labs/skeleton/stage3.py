"""Stage 3 for lab zero3: nano's stage-3 engine, with its two storage verbs yours (given).

ZeRO-3 keeps only this rank's partition of every unit's flat buffer between uses. Which parameters
form a unit, when each is needed (before its forward and its backward) and when it is done, nano's
engine decides (zero_lab/nano/unit_gathering.py); what happens then is lab.py's:
    lab.gather_unit(buffer, comm)   before a unit's use: the whole buffer from every rank's partition
    lab.release_unit(buffer)        after its use: only the partition remains
Each buffer gathers in a call of its own here (nano may gather several in one call: the same bytes).
"""

from __future__ import annotations

from . import lab


def initialize(model, model_parameters, config):
    """nano's `initialize`, its stage-3 buffers made whole and released by lab.py's functions."""
    import zero_lab.nano as nano
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
    return nano.initialize(model=model, model_parameters=model_parameters, config=config)
