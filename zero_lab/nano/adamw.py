"""AdamW (and Adam) over fp32 master partitions: the one place nano's Adam math lives (Muon's: `muon/`).

The update is torch.optim.AdamW's single-tensor algorithm, operation for operation, so a nano run
can be compared element by element with a single-process torch.optim.AdamW reference. Per flat
buffer the optimizer sees one tensor: this rank's fp32 master partition; its exp_avg and exp_avg_sq
(the optimizer-state partition) are created at the first step. The update runs over the partition
in chunks, so its temporaries (the denominator) stay a chunk in size instead of a partition: small
chunks on CPU, large ones on GPUs where each chunk costs kernel launches. The arithmetic is
elementwise, so chunking does not change a single bit.
"""

from __future__ import annotations

import math

import torch

CHUNK_NUMEL = {"cpu": 1 << 16, "cuda": 1 << 24}


def chunk_numel(device: torch.device) -> int:
    return CHUNK_NUMEL.get(device.type, 1 << 20)


@torch.no_grad()
def adam_update(parameter: torch.Tensor, gradient: torch.Tensor, exp_avg: torch.Tensor, exp_avg_sq: torch.Tensor,
                step: int, lr: float, betas: tuple[float, float], eps: float, weight_decay: float,
                decoupled_weight_decay: bool) -> None:
    """One Adam step in place on `parameter`; decoupled decay is AdamW, otherwise L2 (Adam)."""
    beta1, beta2 = betas
    if decoupled_weight_decay:
        parameter.mul_(1 - lr * weight_decay)
    elif weight_decay != 0:
        gradient = gradient.add(parameter, alpha=weight_decay)
    exp_avg.lerp_(gradient, 1 - beta1)
    exp_avg_sq.mul_(beta2).addcmul_(gradient, gradient, value=1 - beta2)
    step_size = lr / (1 - beta1 ** step)
    denominator = torch.sqrt(exp_avg_sq).div_(math.sqrt(1 - beta2 ** step)).add_(eps)
    parameter.addcdiv_(exp_avg, denominator, value=-step_size)


class PartitionedAdam(torch.optim.Optimizer):
    """torch.optim-compatible holder of hyper-parameters (so LR schedulers work) and Adam states.

    param_groups[i]["params"] are the fp32 master partitions of parameter group i, one per flat
    buffer of that group (one at stages 0-2); `step(gradients)` takes the matching fp32 gradient
    partitions, gradients[i][j] for param_groups[i]["params"][j].
    """

    def __init__(self, master_partitions: list[list[torch.Tensor]], groups: list[dict], lr: float,
                 betas: tuple[float, float], eps: float, weight_decay: float, decoupled_weight_decay: bool):
        """`groups` are the parameter groups' dicts (options, and a client optimizer's own dicts): each
        takes its masters as "params" in place, so whoever holds the dict sets the lr this Adam uses.
        A group's own "decoupled_weight_decay" (torch's Adam and AdamW have one) overrides the default."""
        defaults = {"lr": lr, "betas": tuple(betas), "eps": eps, "weight_decay": weight_decay,
                    "decoupled_weight_decay": decoupled_weight_decay}
        for group, masters in zip(groups, master_partitions):
            group["params"] = masters
        super().__init__(groups, defaults)

    def prepare_updates(self, partitions: list[torch.Tensor]) -> None:
        """Step Phase 2b: nothing, Adam is element-wise (Muon gathers whole matrices here: `muon/`)."""

    @torch.no_grad()
    def step(self, gradients: list[list[torch.Tensor]]) -> None:  # type: ignore[override]
        for group, group_gradients in zip(self.param_groups, gradients):
            for master, gradient in zip(group["params"], group_gradients):
                self._update(master, gradient, group)

    def _update(self, master: torch.Tensor, gradient: torch.Tensor, group: dict) -> None:
        state = self.state[master]
        if not state:
            state.update(step=0, exp_avg=torch.zeros_like(master), exp_avg_sq=torch.zeros_like(master))
        state["step"] += 1
        for start in range(0, master.numel(), size := chunk_numel(master.device)):
            piece = slice(start, start + size)
            adam_update(master[piece], gradient[piece], state["exp_avg"][piece], state["exp_avg_sq"][piece],
                        state["step"], float(group["lr"]), group["betas"], group["eps"], group["weight_decay"],
                        group["decoupled_weight_decay"])  # float(): a schedule may keep lr as a tensor

    def state_bytes(self) -> int:
        """Bytes of the optimizer-state partitions (exp_avg + exp_avg_sq of every master)."""
        return sum(tensor.numel() * tensor.element_size() for state in self.state.values()
                   for tensor in state.values() if isinstance(tensor, torch.Tensor))
