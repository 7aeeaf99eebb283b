"""The single-process reference every ZeRO stage is held to, and the tiny model both train.

The reference is torch.optim.AdamW stepping on the global batch: all micro-batches of all ranks
of one optimizer step, concatenated, with one mean loss (and torch's clip_grad_norm_). A nano rank
sees micro-batch (step, micro, rank) and a mean loss over it; with equal micro-batch sizes the
averaged gradients are the same, so parameters must match after every step.
"""

from __future__ import annotations

import copy

import torch

from tests.tolerances import ADAM_EPS

INPUT_FEATURES, HIDDEN, OUTPUTS = 7, 13, 5  # 200 parameters: uneven partitions over 3 ranks


def build_model(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(INPUT_FEATURES, HIDDEN), torch.nn.LayerNorm(HIDDEN), torch.nn.Tanh(),
                               torch.nn.Linear(HIDDEN, OUTPUTS))


def parameter_groups(model: torch.nn.Module, weight_decay: float) -> list[dict]:
    """Decay on matrices only, as training scripts usually do (two flat buffers in nano)."""
    decay = [parameter for parameter in model.parameters() if parameter.dim() >= 2]
    no_decay = [parameter for parameter in model.parameters() if parameter.dim() < 2]
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def micro_batch(step: int, micro: int, rank: int, size: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(100_000 * step + 100 * micro + rank)
    return torch.randn(size, INPUT_FEATURES, generator=generator)


def loss_of(model: torch.nn.Module, inputs: torch.Tensor) -> torch.Tensor:
    return model(inputs).pow(2).mean()


def train_steps(engine, config: dict, rank: int, steps: int, micro_size: int, on_step=None) -> list[float]:
    """The harness's loop on an engine of DeepSpeed's API: per micro-step this rank's micro-batch forward,
    engine.backward, engine.step; `on_step(step, engine)` after each optimizer step. Returns this rank's
    losses, one per micro-step."""
    losses = []
    for step in range(steps):
        for micro in range(config["gradient_accumulation_steps"]):
            loss = loss_of(engine, micro_batch(step, micro, rank, micro_size))
            losses.append(loss.item())
            engine.backward(loss)
            engine.step()
        if on_step is not None:
            on_step(step, engine)
    return losses


class ReferenceTrainer:
    """torch.optim.AdamW on the global batch."""

    def __init__(self, model: torch.nn.Module, lr: float, weight_decay: float, clipping: float):
        self.model = copy.deepcopy(model)
        self.clipping = clipping
        self.optimizer = torch.optim.AdamW(parameter_groups(self.model, weight_decay), lr=lr, eps=ADAM_EPS)

    def step(self, step: int, world_size: int, accumulation: int, micro_size: int, loss_factor: float = 1.0) -> None:
        """One AdamW step on the global batch; `loss_factor` scales its mean loss (a sum over ranks
        or micro-steps instead of a mean)."""
        inputs = torch.cat([micro_batch(step, micro, rank, micro_size)
                            for micro in range(accumulation) for rank in range(world_size)])
        self.optimizer.zero_grad()
        (loss_of(self.model, inputs) * loss_factor).backward()
        if self.clipping > 0:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.clipping)
        self.optimizer.step()


def max_difference(first: torch.nn.Module, second: torch.nn.Module) -> float:
    return max((a.detach().float() - b.detach().float()).abs().max().item()
               for a, b in zip(first.parameters(), second.parameters()))
