"""nano's modules import only the layers below them, as the package docstring lists them."""

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
        for name in re.findall(r"[a-z_0-9]+", layer):
            layers[name] = position
    return layers


def nano_imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("zero_lab.nano"):
            if node.module == "zero_lab.nano":
                names.update(alias.name for alias in node.names)
            else:
                names.add(node.module.split(".")[2])
    return names


def test_every_module_is_listed_and_imports_only_lower_layers():
    layers = layer_of()
    modules = {path.stem for path in PACKAGE.glob("*.py") if path.stem != "__init__"}
    assert modules == set(layers), f"listed but missing: {set(layers) - modules}; unlisted: {modules - set(layers)}"
    for module in sorted(modules):
        for imported in nano_imports(PACKAGE / f"{module}.py"):
            assert layers[imported] < layers[module], f"{module} (layer {layers[module]}) imports {imported} " \
                                                      f"(layer {layers[imported]})"
