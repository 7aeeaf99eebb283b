"""Lab zero3: ZeRO-3. Gather each unit before its forward and its backward, and release it after.

At stage 3 a rank keeps only its partition of every parameter: 4 B x P / N, with Adam's states
2 x 4 B x P / N. A unit (a module's own parameters, or a decoder layer's) is whole only while it
is used. on_nano.py runs nano's stage-3 engine, which decides when; these two functions are what
happens then. `buffer` is one unit's flat buffer (zero_lab/nano/sharded_flat_buffer.py):
    buffer.full          the whole flat buffer, padded; the unit's parameters are views of it. While
                         released its storage holds 0 bytes (buffer.full.untyped_storage().nbytes())
    buffer.full_nbytes   the bytes of the whole buffer
    buffer.partition     this rank's partition (its own storage; Adam updates it)

`comm` is nano's instrumented collectives (zero_lab/nano/collectives.py): comm.world_size, comm.rank,
comm.all_gather_into_tensor(output, local), comm.all_reduce(tensor). Every call is counted and compared.
"""

LAB = "zero3"
STAGE = 3
ON_NANO = True  # engine.py runs nano's stage-3 engine with these two functions (on_nano.py)


def gather_unit(buffer, comm) -> None:
    """Before the unit's use: give buffer.full its storage back (buffer.full_nbytes) and fill it with
    every rank's partition, rank 0's first. An all-gather sends (N-1)/N of the buffer."""
    raise NotImplementedError("lab zero3: write gather_unit in lab.py")


def release_unit(buffer) -> None:
    """After the unit's use: free buffer.full's storage (0 bytes); buffer.partition stays."""
    raise NotImplementedError("lab zero3: write release_unit in lab.py")
