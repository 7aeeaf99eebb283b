"""`--optimizer adamw|muon`: which optimizer section a run's config gets, the same for every impl.

`muon` turns the config's AdamW section into official DeepSpeed's Muon section: Muon (lr 0.02,
its default) for the 2-D hidden weights, which both engines tag from the model as official does
(`zero_lab/nano/muon/groups.py`), and the config's AdamW hyper-parameters for the rest (`adam_lr`,
`betas`, `eps`, and the shared `weight_decay`). `adamw` turns a Muon section back into AdamW.
A config that already names the optimizer wanted is left as it is.
"""

from __future__ import annotations

OPTIMIZERS = ("adamw", "muon")
ADAM_DEFAULTS = {"lr": 1e-3, "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 0.0}


def with_optimizer(config: dict, name: str | None) -> dict:
    """The config with the optimizer `name` (None: the config's own)."""
    section = config.get("optimizer") or {"type": "AdamW", "params": {}}
    kind = str(section.get("type", "")).lower()
    if name is None or kind == name:
        return config
    params = dict(section.get("params", {}))
    if name == "muon":
        adam = {**ADAM_DEFAULTS, **params}
        muon = {"adam_lr": adam["lr"], "betas": adam["betas"], "eps": adam["eps"], "weight_decay": adam["weight_decay"]}
        muon.update({key: params[key] for key in ("torch_adam", "adam_w_mode") if key in params})
        return {**config, "optimizer": {"type": "Muon", "params": muon}}
    adam = {"lr": params.get("adam_lr", params.get("lr", ADAM_DEFAULTS["lr"]))}
    adam.update({key: params[key] for key in ("betas", "eps", "weight_decay", "torch_adam", "adam_w_mode") if key in params})
    return {**config, "optimizer": {"type": "AdamW", "params": adam}}


def uses_muon(config: dict) -> bool:
    return str((config.get("optimizer") or {}).get("type", "")).lower() == "muon"
