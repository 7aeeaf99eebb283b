"""An engine of the user's own as an impl: `--impl NAME=PATH`, beside nano, official and FSDP2.

PATH is a `.py` file or a package directory exposing DeepSpeed's entry points:
`initialize(model=, model_parameters=, config=)`, which returns (engine, optimizer, dataloader,
scheduler), and `init_distributed(dist_backend=, timeout=)` (optional: torch's own process group
otherwise). The harness then asks of the engine only DeepSpeed's core calls:

    engine(**batch), engine.backward(loss), engine.step()
    engine.module, engine.train(), engine.eval()
    engine.optimizer (may be None)

Everything else the harness reads (stage, accumulation, gradient norm, learning rate, skipped
steps, memory by category) is optional: `OwnEngine` answers it from the engine when the engine
has it, from the config when the config says it, and as not available (nan) otherwise. Memory and
wire bytes are measured from outside the engine (the memory tracker, the communication meter) as
for every impl.

Phase 1 (CLI and harness): `split_impl` reads NAME=PATH and `impl_problem` says what is wrong with it.
Phase 2 (harness, each rank): `load_module` imports PATH; `OwnEngine` wraps what `initialize` returned.
"""

from __future__ import annotations

import importlib
import importlib.util
import math
import re
import sys
from pathlib import Path
from types import ModuleType

BUILT_IN_IMPLS = ("nano", "official", "fsdp2")
NAME_PATTERN = re.compile(r"[A-Za-z][A-Za-z0-9_-]*\Z")
OWN_IMPL_FIX = ("Write NAME=PATH: a name of letters, digits, - and _, and a .py file or a package directory "
                "(with __init__.py) exposing initialize() and init_distributed()")


def split_impl(text: str) -> tuple[str, Path | None]:
    """'nano' -> ('nano', None); 'mine=engines/mine.py' -> ('mine', Path('engines/mine.py'))."""
    name, separator, path = text.partition("=")
    return (name.strip(), Path(path.strip()).expanduser() if separator else None)


def impl_problem(text: str) -> str | None:
    """Why `text` is not an impl (a built-in name or NAME=PATH), in words; None when it is one."""
    name, path = split_impl(text)
    if path is None:
        return None if name in BUILT_IN_IMPLS else (
            f"unknown impl {name!r}: choose from {', '.join(BUILT_IN_IMPLS)}, or give your own engine as NAME=PATH")
    if name in BUILT_IN_IMPLS:
        return f"impl name {name!r} in {text!r} is a built-in impl's"
    if not NAME_PATTERN.match(name):
        return f"impl name {name!r} in {text!r} is not a name"
    if path.is_dir():
        return None if (path / "__init__.py").is_file() else f"{path} is a directory without __init__.py"
    if not path.is_file():
        return f"engine {path} (impl {name}) does not exist"
    return None if path.suffix == ".py" else f"engine {path} (impl {name}) is not a .py file"


def load_module(path: Path) -> ModuleType:
    """Import the engine at `path`: a package directory (its relative imports work), or a .py file
    whose folder joins sys.path for its own sibling imports."""
    path = Path(path).resolve()
    if path.is_dir():  # its own name when it is one (its absolute imports of itself work), else a made-up one
        name = path.name if path.name.isidentifier() else "own_engine_" + re.sub(r"\W", "_", path.name)
        spec = importlib.util.spec_from_file_location(name, path / "__init__.py",
                                                      submodule_search_locations=[str(path)])
    else:
        if str(path.parent) not in sys.path:
            sys.path.insert(0, str(path.parent))
        name = path.stem
        spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def init_distributed(module: ModuleType, dist_backend: str, timeout) -> None:
    """The engine's own `init_distributed`, or torch's process group when it has none."""
    if hasattr(module, "init_distributed"):
        module.init_distributed(dist_backend=dist_backend, timeout=timeout)
        return
    import torch.distributed as dist

    if not dist.is_initialized():
        dist.init_process_group(backend=dist_backend, timeout=timeout)


class OwnEngine:
    """A user's engine seen through DeepSpeed's core calls, with every optional figure answered.

    The core calls go straight to the engine; the optional ones are the engine's own when it has
    them (same name as DeepSpeed's), else the config's value, else not available.
    """

    def __init__(self, engine, config: dict):
        self.engine = engine
        self.config = config

    # DeepSpeed's core calls: the minimal API.
    def __call__(self, *args, **kwargs):
        return self.engine(*args, **kwargs)

    def backward(self, loss):
        return self.engine.backward(loss)

    def step(self):
        return self.engine.step()

    def train(self, mode: bool = True):
        return self.engine.train(mode)

    def eval(self):
        return self.engine.eval()

    @property
    def module(self):
        return self.engine.module

    @property
    def optimizer(self):
        return getattr(self.engine, "optimizer", None)

    # Optional figures.
    def _own(self, name: str):
        method = getattr(self.engine, name, None)
        return method() if callable(method) else None

    def zero_optimization_stage(self) -> int:
        stage = self._own("zero_optimization_stage")
        return int(stage if stage is not None else self.config.get("zero_optimization", {}).get("stage", 0))

    def gradient_accumulation_steps(self) -> int:
        steps = self._own("gradient_accumulation_steps")
        return int(steps if steps is not None else self.config.get("gradient_accumulation_steps", 1))

    def get_global_grad_norm(self):
        return self._own("get_global_grad_norm")

    def get_lr(self) -> list[float]:
        lr = self._own("get_lr")
        if lr is not None:
            return list(lr)
        groups = getattr(self.optimizer, "param_groups", None)
        return [groups[0]["lr"]] if groups else [math.nan]

    @property
    def skipped_steps(self) -> int:
        return int(getattr(self.engine, "skipped_steps", 0))

    @property
    def warnings(self) -> list[str]:
        return list(getattr(self.engine, "warnings", []))

    @property
    def memory_breakdown(self):
        """The engine's own bytes by category (nano's `memory_breakdown(by_device=True)` shape), or None."""
        return getattr(self.engine, "memory_breakdown", None)

    def save_checkpoint(self, *args, **kwargs):
        return self.engine.save_checkpoint(*args, **kwargs)

    def load_checkpoint(self, *args, **kwargs):
        return self.engine.load_checkpoint(*args, **kwargs)
