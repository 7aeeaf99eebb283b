"""nano's modules import only the layers below them, as the package docstring lists them.

A module in a sub-package is named by its dotted path below nano (`config.keys` is
zero_lab/nano/config/keys.py) and a sub-package's __init__ by the package's name (`config`).
"""

import ast
import re
from pathlib import Path

import zero_lab.nano

PACKAGE = Path(zero_lab.nano.__file__).parent


def layer_of() -> dict[str, int]:
    """Module name -> its layer's position, from the 'Layers' list in zero_lab/nano/__init__.py."""
    listing = zero_lab.nano.__doc__.split("Layers, each importing only those listed before it:")[1]
    listing = listing.split("(the API")[0]
    layers = {}
    for position, layer in enumerate(listing.split("->")):
        for name in re.findall(r"[a-z_0-9.]+", layer):
            layers[name] = position
    return layers


def module_name(path: Path) -> str:
    """zero_lab/nano/config/keys.py -> 'config.keys'; zero_lab/nano/config/__init__.py -> 'config'."""
    parts = path.relative_to(PACKAGE).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def is_module(name: str) -> bool:
    path = PACKAGE.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def nano_imports(path: Path) -> set[str]:
    """The nano modules `path` imports from, by module_name (`from zero_lab.nano.config import keys`
    names the submodule `config.keys`, `from zero_lab.nano.config import NanoConfig` the package)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("zero_lab.nano"):
            below = node.module.removeprefix("zero_lab.nano").removeprefix(".")
            for alias in node.names:
                submodule = f"{below}.{alias.name}" if below else alias.name
                names.add(submodule if is_module(submodule) or not below else below)
    return names


def test_every_module_is_listed_and_imports_only_lower_layers():
    layers = layer_of()
    modules = {module_name(path) for path in PACKAGE.rglob("*.py") if path.parent != PACKAGE or path.stem != "__init__"}
    assert modules == set(layers), f"listed but missing: {set(layers) - modules}; unlisted: {modules - set(layers)}"
    for path in sorted(PACKAGE.rglob("*.py")):
        module = module_name(path)
        if not module:
            continue
        for imported in nano_imports(path):
            assert layers[imported] < layers[module], f"{module} (layer {layers[module]}) imports {imported} " \
                                                      f"(layer {layers[imported]})"


def test_each_stage_reduces_its_gradients_where_its_row_of_the_stage_table_says():
    """Step Phase 1 is explicit: a stage reducing during backward collects by arrival (stage 2's
    `ArrivalPacking`), stage 1's fp32-accumulation variant in its fp32 gradients (`Fp32Accumulation`),
    the others at the boundary (stage 0's `BoundaryPacking`), and each collection says in both of its
    methods what it does then, rather than inheriting a silent no-op. Every row has its optimizer."""
    from zero_lab.nano import stages
    from zero_lab.nano.facade.initialize import STAGE_OPTIMIZERS
    from zero_lab.nano.stage0 import BoundaryPacking
    from zero_lab.nano.stage1_fp32_accumulation import Fp32Accumulation
    from zero_lab.nano.stage2 import ArrivalPacking

    assert set(STAGE_OPTIMIZERS) == {(row.number, row.variant) for row in stages.STAGES if row.implemented}
    for (number, variant), optimizer in STAGE_OPTIMIZERS.items():
        row = stages.of(number, variant)
        expected = (ArrivalPacking if row.reduces_during_backward else
                    Fp32Accumulation if row.holds_fp32_gradients else BoundaryPacking)
        assert issubclass(optimizer.GradientCollection, expected), \
            f"{row.name} collects with {optimizer.GradientCollection.__name__}, not {expected.__name__}"
    for collection in (BoundaryPacking, ArrivalPacking, Fp32Accumulation):
        assert {"after_backward", "reduce_at_boundary"} <= set(vars(collection)), collection.__name__
