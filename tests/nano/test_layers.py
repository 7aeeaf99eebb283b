"""nano's modules import only the layers below them, as the package docstring lists them (a module
of a sub-package by its dotted name: `checkpoint.files`)."""

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
    """`checkpoint/files.py` -> `checkpoint.files`."""
    return ".".join(path.relative_to(PACKAGE).with_suffix("").parts)


def nano_imports(path: Path) -> set[str]:
    """The nano modules a file imports, by dotted name (`from zero_lab.nano.checkpoint import files`
    imports `checkpoint.files`)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("zero_lab.nano"):
            within = node.module.removeprefix("zero_lab.nano").removeprefix(".")
            if not within or (PACKAGE / within.replace(".", "/")).is_dir():
                names.update(f"{within}.{alias.name}" if within else alias.name for alias in node.names)
            else:
                names.add(within)
    return names


def test_every_module_is_listed_and_imports_only_lower_layers():
    layers = layer_of()
    paths = {module_name(path): path for path in PACKAGE.rglob("*.py") if path.stem != "__init__"}
    modules = set(paths)
    assert modules == set(layers), f"listed but missing: {set(layers) - modules}; unlisted: {modules - set(layers)}"
    for module in sorted(modules):
        for imported in nano_imports(paths[module]):
            assert layers[imported] < layers[module], f"{module} (layer {layers[module]}) imports {imported} " \
                                                      f"(layer {layers[imported]})"
