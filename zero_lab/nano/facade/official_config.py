"""Turn a nano config into one official DeepSpeed accepts, so the same JSON drives both engines.

Phase 1: validate it as nano would (so a bad config fails here, with nano's one-line error),
         all but the keys only official knows, which are official's to read.
Phase 2: copy it, dropping nothing DeepSpeed knows (nano's keys are a subset of DeepSpeed's), and
         spell out the Adam hyper-parameters nano resolved: the optimizer official builds may have
         other defaults (torch.optim.AdamW's weight_decay is 0.01, DeepSpeed's and nano's 0).
         Muon's keys go as written (`_muon_for_official`).
Phase 3: adapt to the device: on CPU ask DeepSpeed for torch.optim's AdamW (`torch_adam`), which
         is the same math nano uses and avoids JIT-compiling FusedAdam (about 50 s on 2 cores).
         With the optimizer offloaded, official builds its own CPU Adam (a C++ op it compiles)
         unless told otherwise: `torch_adam` and `zero_force_ds_cpu_optimizer: false` give it
         torch.optim's AdamW on the host, nano's math, on every device.
"""

from __future__ import annotations

import copy
from typing import Any

from zero_lab.nano.config import read_config_source, validate_config, without_official_only_keys
from zero_lab.nano.errors import NanoConfigError


def to_official_config(config: Any, device: str = "cuda") -> dict:
    """A dict official DeepSpeed accepts, derived from a nano config (dict or JSON path)."""
    raw = read_config_source(config)
    nano = validate_config(without_official_only_keys(raw))  # Phase 1 (batch sizes: each engine checks them)
    official = copy.deepcopy(raw)  # Phase 2
    if nano.optimizer is not None and nano.optimizer.type == "Muon":
        _muon_for_official(official, nano)
    elif nano.optimizer is not None:
        resolved = nano.optimizer.params
        params = official["optimizer"].setdefault("params", {})
        for name in ("lr", "betas", "eps", "weight_decay"):
            params.setdefault(name, list(getattr(resolved, name)) if name == "betas" else getattr(resolved, name))
    offloads = nano.zero_optimization.offload_optimizer.enabled
    if offloads and "optimizer" in official:  # Phase 3
        official["optimizer"].setdefault("params", {})["torch_adam"] = True
        official.setdefault("zero_force_ds_cpu_optimizer", False)
    if device == "cpu":
        if official.get("fp16", {}).get("enabled"):
            raise NanoConfigError("official DeepSpeed does not support fp16 on CPU; use bf16 or fp32 there")
        if "optimizer" in official:
            official["optimizer"].setdefault("params", {})["torch_adam"] = True
    return official


def _muon_for_official(official: dict, nano) -> None:
    """Muon's keys go as written: each half's defaults are official's own (spelling out the shared
    `lr` would override both). Official's stage 3 runs Muon only with `reduce_scatter` false (its
    Muon path all-reduces the gradients; nano's stage 3 reduce-scatters them either way)."""
    if nano.zero_optimization.stage == 3:
        official.setdefault("zero_optimization", {})["reduce_scatter"] = False
