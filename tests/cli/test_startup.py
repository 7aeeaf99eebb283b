"""The CLI answers at once: importing the app loads none of the heavy libraries; each command
imports what it needs where it uses it."""

import subprocess
import sys

HEAVY = ("torch", "transformers", "deepspeed", "pandas", "matplotlib")


def test_the_cli_app_imports_no_heavy_module():
    script = f"import sys, zero_lab.cli.app; print(sorted(m for m in {HEAVY!r} if m in sys.modules))"
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]", f"zero_lab.cli.app imports {done.stdout.strip()}"
