"""Which parameters Muon updates, and the parameter groups the two halves of the optimizer get.

Phase 1 (tag): official DeepSpeed's rule, applied by `initialize` from the model it is given: a
         parameter of two or more dimensions whose name holds neither "embed" nor "lm_head" gets
         `use_muon = True` (the hidden matrices); every other one `use_muon = False` (embeddings,
         the output head, norms, biases), for the AdamW half.
Phase 2 (split): each incoming group becomes a Muon half and an AdamW half. A half's settings
         are, most specific last: the config's shared key (`lr`, `weight_decay`), the half's own
         key (`muon_lr`, `adam_lr`), then the incoming group's own value; unset, the half's
         default (Muon: lr 0.02, momentum 0.95; AdamW: lr 3e-4, betas (0.9, 0.95), eps 1e-10).
         The Muon half's matrices are ordered largest shape first, as official's optimizer orders
         them, so nano lays them out in the flat buffer in official's order.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from zero_lab.nano.errors import NanoConfigError

if TYPE_CHECKING:  # pure arithmetic for `explain`, which loads no torch
    import torch

    from zero_lab.nano.config.schema import MuonParams

NOT_HIDDEN = ("embed", "lm_head")  # name parts of matrices that are not hidden layers
MUON_KEYS = ("lr", "momentum", "weight_decay", "ns_method")
ADAM_KEYS = ("lr", "betas", "eps", "weight_decay")
MUON_DEFAULTS = {"lr": 0.02, "momentum": 0.95, "weight_decay": 0.0, "ns_method": "gram"}
ADAM_DEFAULTS = {"lr": 3e-4, "betas": (0.9, 0.95), "eps": 1e-10, "weight_decay": 0.0}


def is_hidden_matrix(name: str, shape: tuple[int, ...]) -> bool:
    """Phase 1's rule for one parameter: two or more dimensions, and neither "embed" nor "lm_head"."""
    return len(shape) >= 2 and not any(part in name.lower() for part in NOT_HIDDEN)


def largest_first(shapes: list[tuple[int, ...]]) -> list[int]:
    """The positions of the Muon half's parameters in official's order: largest shape first (stable)."""
    return sorted(range(len(shapes)), key=lambda position: tuple(shapes[position]), reverse=True)


def tag_parameters(model: torch.nn.Module) -> None:
    """Phase 1: `use_muon` on every parameter of the model."""
    for name, parameter in model.named_parameters():
        parameter.use_muon = is_hidden_matrix(name, tuple(parameter.shape))


def _half_settings(params: MuonParams, keys: tuple[str, ...], defaults: dict, own_lr: str) -> dict:
    settings = dict(defaults)
    settings.update({key: getattr(params, key) for key in keys if key in params.model_fields_set})
    if getattr(params, own_lr) is not None:
        settings["lr"] = getattr(params, own_lr)
    if "betas" in settings:
        settings["betas"] = tuple(settings["betas"])
    return settings


def split_groups(groups: list[dict], params: MuonParams) -> list[dict]:
    """Phase 2: the groups nano's optimizer takes, each marked with `use_muon`."""
    untagged = [parameter for group in groups for parameter in group["params"] if not hasattr(parameter, "use_muon")]
    if untagged:
        raise NanoConfigError(f"{len(untagged)} parameters given to Muon are not the model's, so none is tagged "
                              "use_muon; pass the model's own parameters, or set param.use_muon on them")
    halves = ((True, "muon", MUON_KEYS, _half_settings(params, MUON_KEYS, MUON_DEFAULTS, "muon_lr")),
              (False, "adam", ADAM_KEYS, _half_settings(params, ADAM_KEYS, ADAM_DEFAULTS, "adam_lr")))
    split = []
    for index, group in enumerate(groups):
        overrides = {key: value for key, value in group.items() if key != "params"}
        for use_muon, label, keys, settings in halves:
            members = [parameter for parameter in group["params"] if bool(parameter.use_muon) is use_muon]
            if not members:
                continue
            if use_muon:
                members = [members[position] for position in largest_first([tuple(p.shape) for p in members])]
            prefix = overrides.get("name") or (f"group{index}" if len(groups) > 1 else None)
            half = {**settings, **{key: value for key, value in overrides.items() if key in keys}}
            split.append({"params": members, "use_muon": use_muon,
                          "name": f"{prefix}-{label}-params" if prefix else f"{label}-params", **half})
    return split
