"""The `zero-lab` executable: a Ctrl-C while the CLI is still importing ends it as one afterwards
does, with exit code 130 and no traceback. The app imports no heavy library (torch, pandas,
matplotlib, transformers): each command imports those where it uses them, so `--help` answers at once.

    zero-lab --help
"""

from __future__ import annotations

import sys


def main() -> None:
    try:
        from zero_lab.launch import moments  # imports nothing else

        moments.reached("cli-started")
        from zero_lab.cli.app import main as run_command
    except KeyboardInterrupt:
        sys.exit(130)
    run_command()
