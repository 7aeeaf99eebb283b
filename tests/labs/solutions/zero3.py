"""The reference solution of lab zero3 (kept in the tests, not in the package a learner gets)."""

LAB = "zero3"
STAGE = 3
ON_NANO = True


def gather_unit(buffer, comm):
    buffer.full.untyped_storage().resize_(buffer.full_nbytes)
    comm.all_gather_into_tensor(buffer.full, buffer.partition)


def release_unit(buffer):
    buffer.full.untyped_storage().resize_(0)
