"""What a training rank does differently when torchrun has restarted its group (`--max-restarts`).

torchrun's elastic agent restarts every worker of the job when one dies, at most `--max-restarts`
times; each worker reads which attempt it is in `TORCHELASTIC_RESTART_COUNT` (0 first). A restarted
worker starts from nothing, so the harness makes it continue where the job left off:

    Phase 1 (`resume_tag`): on an attempt after the first, resume from the checkpoint `latest`
             names in --save-dir (the newest complete one: `commit_latest` moves it only once
             every rank has saved); with none yet saved, train again from step 1.
    Phase 2: steps run from the checkpoint's step + 1, and each step's batches are the ones its
             step number selects (`workload.data.Batches`), so no batch is skipped or seen twice
             in the final run; the steps between the checkpoint and the loss are repeated, each
             `[opt_step k]` line saying its `attempt`.
    Phase 3 (`commit_latest`): a save moves `latest` only after a barrier that every rank reaches
             with its files written, so a rank killed during a save leaves `latest` naming the
             previous checkpoint. (Official DeepSpeed's own save writes `latest` on rank 0 as
             soon as rank 0's files are written.)
"""

from __future__ import annotations

import os

from zero_lab.nano.checkpoint.files import LATEST, write_latest
from zero_lab.workload.rank_pause import restart_attempt


def resume_tag(save_dir: str | None, resume: str | None, attempt: int | None = None) -> str | None:
    """Phase 1: the --resume value this attempt runs with (None: from step 1)."""
    attempt = restart_attempt() if attempt is None else attempt
    if attempt > 0 and save_dir and os.path.isfile(os.path.join(save_dir, LATEST)):
        return "latest"
    return resume


def commit_latest(save_dir: str, tag: str, rank: int, barrier) -> None:
    """Phase 3, after every rank's `save_checkpoint(save_latest=False)`: once all are past the
    barrier, rank 0 points `latest` at the tag (written to a temporary name, then renamed)."""
    barrier()
    if rank == 0:
        write_latest(save_dir, tag)
