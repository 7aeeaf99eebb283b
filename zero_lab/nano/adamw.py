"""AdamW (and Adam) over fp32 master partitions: the one place nano's Adam math lives (Muon's: `muon/`).

Per flat buffer the optimizer sees one tensor, this rank's fp32 master partition, whose exp_avg and
exp_avg_sq (the optimizer-state partition) appear at the first step. One call of torch's fused kernel
(`torch.optim.AdamW(fused=True)`'s) updates all of a group's partitions: no temporaries, one call instead
of ten per partition (stage 3 has one per unit), every thread of a CPU (offload's host step). It rounds as
torch.optim.AdamW to a parameter's last bit (`tests/tolerances.py`), the same however it is partitioned.
"""

from __future__ import annotations

import torch


@torch.no_grad()
def fused_adam(masters: list[torch.Tensor], gradients: list[torch.Tensor], exp_avgs: list[torch.Tensor],
               exp_avg_sqs: list[torch.Tensor], step: int, group: dict) -> None:
    """Step `step` of Adam in place on every master (one device): AdamW with decoupled decay, else Adam's L2."""
    for master, gradient in zip(masters, gradients):  # the kernel reads past a shorter gradient: never let it
        if gradient.shape != master.shape:
            raise RuntimeError(f"a gradient partition of {gradient.numel()} elements must match the size of its master "
                               f"partition, {master.numel()}")
    kernel = torch._fused_adamw_ if group["decoupled_weight_decay"] else torch._fused_adam_
    steps = [torch.tensor(float(step), device=masters[0].device)] * len(masters)  # read, not written, by the kernel
    kernel(masters, gradients, exp_avgs, exp_avg_sqs, [], steps, lr=float(group["lr"]), beta1=group["betas"][0],
           beta2=group["betas"][1], weight_decay=group["weight_decay"], eps=group["eps"], amsgrad=False, maximize=False)


class PartitionedAdam(torch.optim.Optimizer):
    """torch.optim-compatible holder of hyper-parameters (so LR schedulers work) and Adam states.

    param_groups[i]["params"] are the fp32 master partitions of parameter group i, one per flat
    buffer of that group (one at stages 0-2); `step(gradients)` takes the matching fp32 gradient
    partitions, gradients[i][j] for param_groups[i]["params"][j]."""

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
            self._update_all(group["params"], group_gradients, group)

    def _update(self, master: torch.Tensor, gradient: torch.Tensor, group: dict) -> None:  # Muon's AdamW: one by one
        self._update_all([master], [gradient], group)

    def _update_all(self, masters: list[torch.Tensor], gradients: list[torch.Tensor], group: dict) -> None:
        """One fused call per device (offload may keep masters on the host) and step count (a loaded state may mix)."""
        calls: dict[tuple, list[tuple]] = {}
        for master, gradient in zip(masters, gradients):
            state = self.state[master]
            if not state:
                state.update(step=0, exp_avg=torch.zeros_like(master), exp_avg_sq=torch.zeros_like(master))
            state["step"] += 1
            calls.setdefault((master.device, state["step"]), []).append(
                (master, gradient, state["exp_avg"], state["exp_avg_sq"]))
        for (_, step), members in calls.items():
            fused_adam(*map(list, zip(*members)), step, group)

    def state_bytes(self) -> int:
        """Bytes of the optimizer-state partitions (exp_avg + exp_avg_sq of every master)."""
        return sum(tensor.numel() * tensor.element_size() for state in self.state.values()
                   for tensor in state.values() if isinstance(tensor, torch.Tensor))
