"""What torch's own collective check said (`--check-collectives`: TORCH_DISTRIBUTED_DEBUG=DETAIL).

Before each collective, torch's process-group wrapper all-gathers a fingerprint of the call (its
sequence number, operation, tensor shapes and dtypes) and, where the ranks' fingerprints differ,
raises on every rank: "Detected mismatch between collectives on ranks. Rank 0 is running
collective: CollectiveFingerPrint(SequenceNumber=14, OpType=_ALLGATHER_BASE, TensorShape=[1056],
TensorDtypes=Float, ...), but Rank 1 is running collective: CollectiveFingerPrint(...)".

Phase 1: each rank's own fingerprint, from the first such line of its stderr.
Phase 2: the Python frame that issued the call, from the traceback before it: the innermost frame of
         the user's own code (outside the installed packages and zero-lab), else the innermost of
         zero-lab's, else the innermost of all.
"""

from __future__ import annotations

import re

MISMATCH = re.compile(r"Detected mismatch between collectives on ranks\. Rank (\d+) is running collective: "
                      r"CollectiveFingerPrint\(SequenceNumber=(\d+), OpType=(\w+)(?:, TensorShape=(\[[^\]]*\]))?"
                      r"(?:, TensorDtypes=(\w+))?")
FRAME = re.compile(r'File "([^"]+)", line (\d+), in (\S+)')
PACKAGE_ROOTS = ("site-packages", "dist-packages", "/lib/python")


def issuing_frame(traceback_text: str) -> str | None:
    """Phase 2: `file:line in function` of the frame that issued the failed call."""
    frames = FRAME.findall(traceback_text)
    if not frames:
        return None
    own = [frame for frame in frames if not any(root in frame[0] for root in PACKAGE_ROOTS)]
    users = [frame for frame in own if "/zero_lab/" not in frame[0]]
    path, line, function = (users or own or frames)[-1]
    return f"{path.rsplit('/', 1)[-1]}:{line} in {function}"


def torch_check_lines(stderr_by_rank: dict[int, str]) -> list[str]:
    """Evidence lines, one per rank whose stderr holds torch's mismatch error (none without the check)."""
    lines = []
    for rank, text in sorted(stderr_by_rank.items()):
        found = MISMATCH.search(text)  # Phase 1
        if found is None:
            continue
        _, sequence, operation, shape, dtypes = found.groups()
        frame = issuing_frame(text[:found.start()])
        lines.append(f"rank {rank} (torch's check, --check-collectives): collective {sequence}, {operation} of "
                     f"{shape or 'no tensor'} {dtypes or ''}".rstrip() + (f", issued at {frame}" if frame else ""))
    return lines
