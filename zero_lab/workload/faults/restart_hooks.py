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
    Phase 0 (`join_attempt_group`): each attempt's ranks meet in torchrun's agent store, which lives
             through every attempt, under a key prefix of their own (`attempt<k>/`): the keys a
             failed attempt left there (its ranks' addresses) are never read by the next.
    Phase 3 (`commit_latest`): a save moves `latest` only after a barrier that every rank reaches
             with its files written, so a rank killed during a save leaves `latest` naming the
             previous checkpoint. (Official DeepSpeed's own save writes `latest` on rank 0 as
             soon as rank 0's files are written.)
"""

from __future__ import annotations

import datetime
import importlib
import os

from zero_lab.nano.checkpoint.files import LATEST, write_latest
from zero_lab.workload.faults.rank_pause import restart_attempt


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


def join_attempt_group(backend: str, timeout: datetime.timedelta) -> None:
    """Phase 0, under torchrun with --max-restarts and its agent's shared store: the default process
    group on that store, prefixed by the attempt (nano's and DeepSpeed's `init_distributed` then find
    it initialised). Elsewhere nothing: the engine's `init_distributed` makes the group as always."""
    import torch.distributed as dist

    if int(os.environ.get("TORCHELASTIC_MAX_RESTARTS", "0")) == 0 or \
            os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True" or dist.is_initialized():
        return
    importlib.import_module("torch._dynamo")  # before the group exists, as nano's init_distributed does
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False, timeout=timeout)
    dist.init_process_group(backend, store=dist.PrefixStore(f"attempt{restart_attempt()}", store),
                            rank=int(os.environ["RANK"]), world_size=int(os.environ["WORLD_SIZE"]), timeout=timeout)
