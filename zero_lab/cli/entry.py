"""The `zero-lab` executable: importing the CLI takes seconds (torch), and a Ctrl-C meanwhile ends
it as one afterwards does, with exit code 130 and no traceback.

    zero-lab --help
"""

from __future__ import annotations

import sys


def main() -> None:
    try:
        from zero_lab.cli.app import main as run_command
    except KeyboardInterrupt:
        sys.exit(130)
    run_command()
