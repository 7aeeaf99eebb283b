"""Run by Python at start-up in every process zero-lab starts for a user's script: this directory
is first on their PYTHONPATH (`zero_lab.launch.engine_switch`). It prepares official DeepSpeed and,
when asked, the log contract (`zero_lab.clients.startup`), then runs the sitecustomize this one
hides, if the environment has one."""

import importlib.machinery
import importlib.util
import os
import sys

from zero_lab.clients import startup

startup.install()

_here = os.path.dirname(os.path.abspath(__file__))
_rest = [entry for entry in sys.path if os.path.abspath(entry or ".") != _here]
_hidden = importlib.machinery.PathFinder.find_spec("sitecustomize", _rest)
if _hidden is not None and _hidden.loader is not None:
    _module = importlib.util.module_from_spec(_hidden)
    _hidden.loader.exec_module(_module)
