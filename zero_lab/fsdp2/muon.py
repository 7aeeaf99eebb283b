"""FSDP2 with Muon: torch.optim.Muon for the 2-D hidden weights, torch.optim.AdamW for the rest.

Phase 1 (before fully_shard, which replaces every parameter object): official DeepSpeed's tagging
         rule (`nano.muon.groups.tag_parameters`) names the Muon parameters.
Phase 2 (after it): each of the caller's groups is split into its Muon half and its AdamW half,
         each half with the config's settings as official resolves them (`muon_lr`, `adam_lr`,
         ...: `nano.muon.groups.split_groups`); torch.optim.Muon then runs on the DTensor shards,
         whose Newton-Schulz products DTensor computes over the whole matrix.
Where torch.optim.Muon's numbers differ from official DeepSpeed's Muon (docs/muon.md measures it):
    - Newton-Schulz runs in bf16, always, on X itself (official: "gram" in fp32 on CPU, fp16 on
      CUDA); the matrix is divided by max(norm, 1e-7), not norm + 1e-7;
    - the aspect ratio sqrt(max(1, rows/cols)) scales the learning rate, not the update;
    - gradient clipping applies to the gradients before Muon (FSDP2's clip_grad_norm_), where
      official clips the orthogonalised updates together with AdamW's gradients.
"""

from __future__ import annotations

import torch

from zero_lab.nano.muon.groups import split_groups, tag_parameters


def muon_names(model: torch.nn.Module) -> set[str]:
    """Phase 1: the names of the parameters Muon updates."""
    tag_parameters(model)
    return {name for name, parameter in model.named_parameters() if parameter.use_muon}


class MuonAndAdamW:
    """Phase 2: one optimizer to the engine and the schedule, two torch optimizers inside."""

    def __init__(self, groups: list[dict], tagged: set[str], names: dict, muon_params) -> None:
        for group in groups:
            for parameter in group["params"]:
                parameter.use_muon = names[parameter] in tagged
        halves = split_groups(groups, muon_params)
        muon = [{key: value for key, value in half.items() if key not in ("use_muon", "ns_method")}
                for half in halves if half["use_muon"]]
        adam = [{key: value for key, value in half.items() if key != "use_muon"} for half in halves
                if not half["use_muon"]]
        self.optimizers = ([torch.optim.Muon(muon, nesterov=True, adjust_lr_fn="original")] if muon else []) + \
                          ([torch.optim.AdamW(adam, fused=True)] if adam else [])

    @property
    def param_groups(self) -> list[dict]:
        return [group for optimizer in self.optimizers for group in optimizer.param_groups]

    @property
    def state(self) -> dict:
        return {key: value for optimizer in self.optimizers for key, value in optimizer.state.items()}

    def step(self) -> None:
        for optimizer in self.optimizers:
            optimizer.step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        for optimizer in self.optimizers:
            optimizer.zero_grad(set_to_none=set_to_none)
