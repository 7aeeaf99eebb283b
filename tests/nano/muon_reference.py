"""The single-process Muon reference nano's Muon is held to, built on official DeepSpeed's own
`muon_update` (its Newton-Schulz: same coefficients, same five steps) and torch.optim.AdamW.

One step on the global batch, as official DeepSpeed's ZeRO runs MuonWithAuxAdam:
    1. the mean loss of every rank's micro-batches, backward;
    2. each 2-D weight's gradient becomes its Muon update (`muon_update`, momentum kept here);
       the other parameters keep their gradients;
    3. the global norm over the updates and gradients together, and the clip coefficient
       (clip / (norm + 1e-6), when below 1) scales all of them;
    4. a matrix moves by p * (1 - lr * wd) - lr * update; the rest take torch.optim.AdamW.
"""

from __future__ import annotations

import copy
import os

import torch

from tests.nano.reference import loss_of, micro_batch
from tests.tolerances import ADAM_EPS

MUON_LR, ADAM_LR, WEIGHT_DECAY, MOMENTUM = 0.02, 0.01, 0.1, 0.95


def official_muon_update():
    """Official DeepSpeed's `muon_update`, run eagerly (its `torch.compile` would compile for minutes on CPU)."""
    import torch._dynamo.config

    torch._dynamo.config.disable = True
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    from deepspeed.runtime.zero.muon.original_muon import muon_update

    return muon_update


class MuonReference:
    def __init__(self, model: torch.nn.Module, clipping: float, ns_method: str = "gram"):
        self.model = copy.deepcopy(model)
        self.clipping, self.ns_method = clipping, ns_method
        self.muon_update = official_muon_update()
        self.matrices = [parameter for parameter in self.model.parameters() if parameter.dim() >= 2]
        self.others = [parameter for parameter in self.model.parameters() if parameter.dim() < 2]
        self.momentum = {parameter: torch.zeros_like(parameter) for parameter in self.matrices}
        self.adam = torch.optim.AdamW(self.others, lr=ADAM_LR, betas=(0.9, 0.95), eps=ADAM_EPS,
                                      weight_decay=WEIGHT_DECAY)

    @torch.no_grad()
    def step(self, step: int, world_size: int, accumulation: int, micro_size: int) -> None:
        inputs = torch.cat([micro_batch(step, micro, rank, micro_size)
                            for micro in range(accumulation) for rank in range(world_size)])
        for parameter in self.model.parameters():
            parameter.grad = None
        with torch.enable_grad():
            loss_of(self.model, inputs).backward()  # 1
        updates = {parameter: self.muon_update(parameter.grad.clone(), self.momentum[parameter], MOMENTUM,
                                               ns_method=self.ns_method)
                   for parameter in self.matrices}  # 2
        everything = list(updates.values()) + [parameter.grad for parameter in self.others]
        norm = torch.stack([tensor.pow(2).sum() for tensor in everything]).sum().sqrt().item()  # 3
        coefficient = self.clipping / (norm + 1e-6) if self.clipping > 0 else 1.0
        if coefficient < 1.0:
            for tensor in everything:
                tensor.mul_(coefficient)
        for parameter, update in updates.items():  # 4
            parameter.mul_(1 - MUON_LR * WEIGHT_DECAY)
            parameter.add_(update, alpha=-MUON_LR)
        self.adam.step()
