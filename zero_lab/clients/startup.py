"""What a Python process zero-lab started for a user's script does first (from sitecustomize).

Phase 1: official DeepSpeed's environment, before anything imports it (`official_import`).
Phase 2: once `deepspeed` is imported: official's own set-up (no shared-memory op build on CPU);
         and, when the log contract is asked for, `deepspeed.initialize` wrapped (`contract`).
Phase 3: when the log contract is asked for, the meters start as soon as torch is imported, so the
         memory meter sees the model being built, and the communication meter is in place before
         any `init_distributed` (`contract.start_meters`).
Nothing here imports torch: a process that never does (torchrun's own launcher does; `pip` does
not) pays nothing.
"""

from __future__ import annotations

import os
from pathlib import Path

from zero_lab.clients.post_import import after_import
from zero_lab.launch.engine_switch import LOG_CONTRACT
from zero_lab.workload.engines import official_import

PACKAGE_ROOT = Path(__file__).resolve().parents[1]


def device_type() -> str:
    """The accelerator zero-lab named for this run (`DS_ACCELERATOR`): cpu or cuda."""
    return "cpu" if os.environ.get("DS_ACCELERATOR") == "cpu" else "cuda"


def impl_of(deepspeed) -> str:
    """`nano` when the imported `deepspeed` is zero-lab's drop-in, else `official`."""
    return "nano" if PACKAGE_ROOT in Path(deepspeed.__file__).resolve().parents else "official"


def install() -> None:
    device = device_type()
    log_contract = os.environ.get(LOG_CONTRACT) == "1"
    official_import.prepare_environment(device)  # Phase 1

    def on_deepspeed(deepspeed) -> None:  # Phase 2
        impl = impl_of(deepspeed)
        if impl == "official":
            official_import.after_import(deepspeed, device)
        if log_contract:
            from zero_lab.clients import contract

            contract.wrap_initialize(deepspeed, impl)

    def on_torch(torch) -> None:  # Phase 3
        from zero_lab.clients import contract

        contract.start_meters(device)

    after_import("deepspeed", on_deepspeed)
    if log_contract:
        after_import("torch", on_torch)
