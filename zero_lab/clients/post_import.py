"""Run a function right after a module is imported, before the importer sees it.

`after_import("deepspeed", wrap)` puts a finder first on `sys.meta_path` that, when `deepspeed`
is looked for, lets the usual finders locate it, then wraps its loader so that `wrap(module)` runs
once the module's code has run and before `import deepspeed` (or `from deepspeed import
initialize`) returns. The finder stays until the module is executed: a mere look-up
(`importlib.util.find_spec("deepspeed")`, as transformers' `is_deepspeed_available` does) loads
nothing. A module already imported is handed to the function at once.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
from collections.abc import Callable


class _AfterExec(importlib.abc.Loader):
    """The module's own loader, then the finder's callback."""

    def __init__(self, loader, finder: "_Finder"):
        self.loader = loader
        self.finder = finder

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module) -> None:
        self.loader.exec_module(module)
        self.finder.executed(module)

    def __getattr__(self, name):  # get_resource_reader, is_package, ...: the module's own loader answers
        return getattr(self.loader, name)


class _Finder(importlib.abc.MetaPathFinder):
    def __init__(self, name: str, callback: Callable):
        self.name = name
        self.callback = callback
        self.searching = False

    def find_spec(self, fullname, path, target=None):
        if fullname != self.name or self.searching:
            return None
        self.searching = True  # the finders after this one locate the module
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            self.searching = False
        if spec is None or spec.loader is None:
            return None
        spec.loader = _AfterExec(spec.loader, self)
        return spec

    def executed(self, module) -> None:
        if self in sys.meta_path:  # once
            sys.meta_path.remove(self)
            self.callback(module)


def after_import(name: str, callback: Callable) -> None:
    """callback(module) once the top-level module `name` has been imported (now, if it is already)."""
    if name in sys.modules:
        callback(sys.modules[name])
        return
    sys.meta_path.insert(0, _Finder(name, callback))
