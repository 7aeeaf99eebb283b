"""A small token model with every stage-3 trap, and its single-process AdamW reference.

TrapNet: an embedding tied to the head (one parameter in two modules), a ModuleList of blocks of
which one is called twice per forward, a spare block the loss never uses, a final norm, and
optional activation checkpointing of each block call (torch.utils.checkpoint, non-reentrant).
The reference trains a deep copy with torch.optim.AdamW on the global batch, as tests.nano.reference.
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from tests.tolerances import ADAM_EPS

VOCAB, WIDTH, BLOCKS, SEQUENCE = 11, 6, 3, 5


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(WIDTH, WIDTH)
        self.norm = torch.nn.LayerNorm(WIDTH)

    def forward(self, x):
        return x + torch.tanh(self.norm(self.linear(x)))


class TrapNet(torch.nn.Module):
    def __init__(self, checkpointed: bool = False, spare: bool = True):
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, WIDTH)
        self.blocks = torch.nn.ModuleList(Block() for _ in range(BLOCKS))
        self.spare = torch.nn.ModuleList([Block()] if spare else [])  # never used: no gradient reaches it
        self.norm = torch.nn.LayerNorm(WIDTH)
        self.head = torch.nn.Linear(WIDTH, VOCAB, bias=False)
        self.head.weight = self.embed.weight  # tied, as Qwen3-0.6B ties embed_tokens and lm_head
        self.checkpointed = checkpointed

    def call(self, block, x):
        if self.checkpointed and torch.is_grad_enabled():
            return checkpoint(block, x, use_reentrant=False)
        return block(x)

    def forward(self, ids):
        x = self.embed(ids)
        for index, block in enumerate(self.blocks):
            x = self.call(block, x)
            if index == 1:
                x = self.call(block, x)  # the same module twice in one forward
        return self.head(self.norm(x))


def build_trapnet(seed: int = 0, checkpointed: bool = False, spare: bool = True) -> TrapNet:
    """TrapNet; without `spare` every parameter gets a gradient (stages 0/1 then hold every
    param.grad, as the memory formula counts)."""
    torch.manual_seed(seed)
    return TrapNet(checkpointed, spare)


def token_batch(step: int, micro: int, rank: int, size: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(100_000 * step + 100 * micro + rank)
    return torch.randint(0, VOCAB, (size, SEQUENCE), generator=generator)


def token_loss(model, ids: torch.Tensor) -> torch.Tensor:
    logits = model(ids[:, :-1])
    return F.cross_entropy(logits.reshape(-1, VOCAB).float(), ids[:, 1:].reshape(-1))


def decay_groups(model: torch.nn.Module, weight_decay: float, shapes: dict | None = None) -> list[dict]:
    """Decay on matrices only; `shapes` gives the real shapes of parameters built under zero.Init
    (their data is empty until an engine gathers them)."""
    shapes = shapes or {}
    decay = [parameter for parameter in model.parameters() if len(shapes.get(parameter, parameter.shape)) >= 2]
    rest = [parameter for parameter in model.parameters() if len(shapes.get(parameter, parameter.shape)) < 2]
    return [{"params": decay, "weight_decay": weight_decay}, {"params": rest, "weight_decay": 0.0}]


class TokenReference:
    """torch.optim.AdamW on the global batch of token sequences."""

    def __init__(self, model: torch.nn.Module, lr: float, weight_decay: float, clipping: float):
        self.model = copy.deepcopy(model)
        self.clipping = clipping
        self.optimizer = torch.optim.AdamW(decay_groups(self.model, weight_decay), lr=lr, eps=ADAM_EPS)

    def step(self, step: int, world_size: int, accumulation: int, micro_size: int) -> None:
        ids = torch.cat([token_batch(step, micro, rank, micro_size)
                         for micro in range(accumulation) for rank in range(world_size)])
        self.optimizer.zero_grad()
        token_loss(self.model, ids).backward()
        if self.clipping > 0:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.clipping)
        self.optimizer.step()
