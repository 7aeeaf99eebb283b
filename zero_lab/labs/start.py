"""`zero-lab lab start`: write a lab's engine package and its README into a directory.

The package: __init__.py and engine.py from zero_lab/labs/skeleton/ (given, runs stage 0), and
lab.py from zero_lab/labs/todo/<lab>.py (the functions to write, each raising NotImplementedError
naming the lab). No solution travels with it: the reference solutions live in the tests.
"""

from __future__ import annotations

from pathlib import Path

from zero_lab.labs.catalog import Lab

LABS_ROOT = Path(__file__).resolve().parent
SKELETON_FILES = ("__init__.py", "engine.py", "on_nano.py")


def lab_source(lab: Lab) -> str:
    return (LABS_ROOT / "todo" / f"{lab.name}.py").read_text(encoding="utf-8")


def readme(lab: Lab, directory: Path) -> str:
    """The lab's README: the goal, the functions, the formula, the commands, the hints."""
    functions = "\n".join(f"{index}. `{name}`" for index, name in enumerate(lab.functions, 1))
    hints = "\n".join(f"- {hint}" for hint in lab.hints)
    options = f" {lab.compare_options}" if lab.compare_options else ""
    return f"""# Lab {lab.name}: {lab.title}

{lab.goal} The lesson that explains it: {lab.lesson} in zero-lab's repository.

This directory is a small engine package with DeepSpeed's entry points (`init_distributed`,
`initialize`). `engine.py` is given and runs stage 0 (plain data parallelism) as it is; at stage
{lab.stage} it calls the functions of `lab.py`, which you write, in this order:

{functions}

Each states its contract in its docstring and raises `NotImplementedError` until you write it.

## The formula your engine must meet

Per rank, with P the parameters padded to a multiple of the N ranks, in fp32: {lab.formula}.

## Check it

```bash
zero-lab lab check {lab.name} {directory}
```

runs your engine as an impl beside nano (and, once every check passes, official DeepSpeed) on the
tiny model at 2 and 3 ranks, and checks, in order: that it runs; its losses and gradient norms
against nano's; its bytes per rank by category against the formula; its wire bytes per collective.
It stops at the first that fails and says where, with a hint. Your engine is also an impl like any
other: `zero-lab compare --gpus 2 --device cpu --model tiny --stages {lab.stage}{options} --impls nano,official,mine={directory}`.

## Hints

{hints}
"""


def start(lab: Lab, directory: Path) -> list[Path]:
    """Write the lab into `directory` (created; it must not hold a lab already); the files written."""
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for name in SKELETON_FILES:
        target = directory / name
        target.write_text((LABS_ROOT / "skeleton" / name).read_text(encoding="utf-8"), encoding="utf-8")
        written.append(target)
    (directory / "lab.py").write_text(lab_source(lab), encoding="utf-8")
    (directory / "README.md").write_text(readme(lab, directory), encoding="utf-8")
    return written + [directory / "lab.py", directory / "README.md"]
