"""zero-lab: nano, a readable ZeRO engine, and a harness that measures it against official DeepSpeed.

Layers, each importing only the ones below it:
    zero_lab.nano       the engine (collectives -> flat buffers -> per-stage optimizers -> initialize)
    zero_lab.workload   the training workload: models, data, memory and communication meters, log lines
    zero_lab.harness    the torchrun entry that runs the workload under nano or official DeepSpeed
                        (the checkout's harness/train.py is its documented script)
    zero_lab.analysis   pure functions on finished runs: log parsing, metrics, verdicts, reports, estimates
    zero_lab.launch     starting, watching and stopping one torchrun job (command, port, stall, memory)
    zero_lab.cli        the `zero-lab` command: run, compare, parse, report, estimate, explain, doctor
Below them all, importing none: zero_lab.signals, the stop signals a command obeys (Ctrl-C, SIGTERM,
SIGHUP) and the exit code each ends it with (analysis reports it, launch and cli act on it).

For notebooks, logs and comparisons as pandas DataFrames (docs/analysis.md):
    zero_lab.load_steps(paths_or_globs)   one row per (run, rank-0 optimizer step)
    zero_lab.load_phases(paths_or_globs)  one row per [phase] memory sample
    zero_lab.load_runs(paths_or_globs)    one row per run: the summary `compare` reports
    zero_lab.load_comparison(compare_dir) (runs, deltas) as `compare` saved them
They load pandas when first used, not on `import zero_lab`: the CLI starts without it.
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

__all__ = ["load_steps", "load_phases", "load_runs", "load_comparison"]


def __getattr__(name: str):
    """The DataFrame API, imported (with pandas) the first time one of its names is read."""
    if name in __all__:
        return getattr(importlib.import_module("zero_lab.analysis.runs.frames"), name)
    raise AttributeError(f"module 'zero_lab' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
