"""What every rank of `tests.spawn`'s worlds starts with, imported once in the forkserver they fork from.

torch, nano's engine with every stage, and the Hugging Face model the stage-3 workers build (its
import alone took 51 s on 2 loaded cores, in every rank of every world that built it). On a machine
without CUDA also official DeepSpeed, with the CPU accelerator its workers ask for
(`official_workers.import_official_deepspeed`): about 5 s in every rank of every world that
compared with it (eight worlds, 17 ranks), now once. With CUDA it is left to the ranks, which choose
their accelerator themselves. Then `gc.freeze()`: the ranks' garbage collections skip these objects
(the memory workers collect at every moment they measure; scanning transformers' objects made them
slower than fresh processes) and leave their pages shared with the forkserver.
"""

import gc
import os

import torch
import torch.distributed  # noqa: F401
import transformers.models.qwen3.modeling_qwen3  # noqa: F401

import zero_lab.nano.facade.engine  # noqa: F401
import zero_lab.nano.stage3  # noqa: F401

if not torch.cuda.is_available():
    before = os.environ.get("DS_ACCELERATOR")
    os.environ["DS_ACCELERATOR"] = "cpu"  # what official_workers sets before its own import
    import deepspeed  # noqa: F401
    if before is None:  # the ranks' environment stays the one pytest gave
        del os.environ["DS_ACCELERATOR"]
    else:
        os.environ["DS_ACCELERATOR"] = before

gc.freeze()
