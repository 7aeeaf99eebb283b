"""The `zero-lab` command: one Typer app, one module per command group.

    zero-lab compare --gpus 2 --device cpu --stages 1,2 --report reports/cpu-demo.md
    zero-lab --help

Exit codes everywhere: 0 fine, 1 a gate failed, 2 bad input, 3 a run failed, 130 interrupted.
"""

from __future__ import annotations

import typer

from zero_lab.cli.compare_cmd import compare
from zero_lab.cli.inspect_cmd import parse, report
from zero_lab.cli.run_cmd import EXTRA_ARGS, run
from zero_lab.cli.tools_cmd import config_app, doctor, estimate

app = typer.Typer(
    name="zero-lab",
    help="nano vs official DeepSpeed: memory, loss and speed, side by side. On CPU, --gpus N means N processes.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
app.command(context_settings=EXTRA_ARGS)(run)
app.command(context_settings=EXTRA_ARGS)(compare)
app.command()(parse)
app.command()(report)
app.command()(estimate)
app.command()(doctor)
app.add_typer(config_app, name="config")


def main() -> None:
    app()


if __name__ == "__main__":
    main()
