"""What every rank of `tests.spawn`'s worlds starts with, imported once in the forkserver they fork from.

torch, nano's engine with every stage, and the Hugging Face model the stage-3 workers build (its
import alone took 51 s on 2 loaded cores, in every rank of every world that built it). Then
`gc.freeze()`: the ranks' garbage collections skip these objects (the memory workers collect at
every moment they measure; scanning transformers' objects made them slower than fresh processes)
and leave their pages shared with the forkserver.
"""

import gc

import torch  # noqa: F401
import torch.distributed  # noqa: F401
import transformers.models.qwen3.modeling_qwen3  # noqa: F401

import zero_lab.nano.engine  # noqa: F401
import zero_lab.nano.stage3  # noqa: F401

gc.freeze()
