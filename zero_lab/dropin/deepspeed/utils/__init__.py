"""`deepspeed.utils`: DeepSpeed's logger (the Trainer sets its level), `log_dist`, and the stage-3
leaf-module API (`set_z3_leaf_modules`: nano's `policies.leaf_modules`)."""

from __future__ import annotations

import logging
from typing import Optional

import torch.distributed

from zero_lab.nano.policies.leaf_modules import (get_z3_leaf_modules, set_z3_leaf_modules, unset_z3_leaf_modules,
                                                 z3_leaf_module)

logger = logging.getLogger("DeepSpeed")
if not logger.handlers:
    _handler = logging.StreamHandler()
    _handler.setFormatter(logging.Formatter("[%(asctime)s] [%(levelname)s] [%(filename)s:%(lineno)d] %(message)s"))
    logger.addHandler(_handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False


def log_dist(message: str, ranks: Optional[list[int]] = None, level: int = logging.INFO) -> None:
    """Log `message` on the listed ranks (all ranks: [-1]; default rank 0), as DeepSpeed's log_dist."""
    rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
    ranks = [0] if ranks is None else ranks
    if -1 in ranks or rank in ranks:
        logger.log(level, f"[Rank {rank}] {message}")


__all__ = ["logger", "log_dist", "set_z3_leaf_modules", "unset_z3_leaf_modules", "get_z3_leaf_modules",
           "z3_leaf_module"]
