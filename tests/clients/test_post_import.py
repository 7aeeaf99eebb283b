"""after_import: the callback runs once, after the module's code and before the importer gets it;
a look-up alone (`importlib.util.find_spec`, as transformers makes for deepspeed) does not use it up."""

import importlib.util
import sys

from zero_lab.clients.post_import import after_import


def test_the_callback_runs_once_after_the_module_and_a_lookup_does_not_use_it_up(tmp_path, monkeypatch):
    (tmp_path / "zl_probe_module.py").write_text("VALUE = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    calls = []

    def wrap(module):
        calls.append(module.VALUE)  # the module's code has run
        module.VALUE = 2  # what the importer gets

    after_import("zl_probe_module", wrap)
    try:
        assert importlib.util.find_spec("zl_probe_module") is not None and calls == []
        from zl_probe_module import VALUE

        assert VALUE == 2 and calls == [1]
        importlib.reload(sys.modules["zl_probe_module"])
        assert calls == [1]
    finally:
        sys.modules.pop("zl_probe_module", None)


def test_a_module_already_imported_is_handed_over_at_once():
    seen = []
    after_import("json", seen.append)
    assert seen == [sys.modules["json"]]
