"""The `zero-lab` command: one Typer app, one module per command group.

    zero-lab compare --gpus 2 --device cpu --stages 1,2 --report reports/cpu-demo.md
    zero-lab --help

Exit codes everywhere: 0 fine, 1 a gate failed, 2 bad input, 3 a run failed, 130 Ctrl-C,
143 SIGTERM, 129 SIGHUP (docs/cli.md, "Faults").
"""

from __future__ import annotations

import sys

import typer

from zero_lab import signals
from zero_lab.cli.checkpoint_cmd import checkpoint_app
from zero_lab.cli.compare_cmd import compare
from zero_lab.cli.config_cmd import config_app
from zero_lab.cli.doctor_cmd import doctor
from zero_lab.cli.exec_cmd import exec_command
from zero_lab.cli.estimate_cmd import estimate
from zero_lab.cli.explain_cmd import explain
from zero_lab.cli.inspect_cmd import parse, report
from zero_lab.cli.lab_cmd import lab_app
from zero_lab.cli.run_cmd import EXTRA_ARGS, run
from zero_lab.cli.timeline_cmd import timeline

app = typer.Typer(
    name="zero-lab",
    help="nano vs official DeepSpeed: memory, loss and speed, side by side. On CPU, --gpus N means N processes.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
app.command(context_settings=EXTRA_ARGS)(run)
app.command(context_settings=EXTRA_ARGS)(compare)
app.command("exec", context_settings=EXTRA_ARGS)(exec_command)
app.command()(parse)
app.command()(report)
app.command()(estimate)
app.command()(explain)
app.command()(doctor)
app.command()(timeline)
app.add_typer(config_app, name="config")
app.add_typer(checkpoint_app, name="checkpoint")
app.add_typer(lab_app, name="lab")


def main() -> None:
    """Run the app; a flag or command Click cannot parse is one `error:` line and exit 2, like all
    bad input (a bare command still prints its help). SIGTERM and SIGHUP stop it as Ctrl-C does."""
    try:
        with signals.stop_signals_raise():
            result = app(standalone_mode=False)
    except typer.Exit as done:
        sys.exit(done.exit_code)
    except (typer.Abort, KeyboardInterrupt, signals.Stopped) as interrupt:
        sys.exit(signals.interrupted_exit_code(signals.signal_name(interrupt)))
    except typer.TyperException as error:  # Click's usage errors
        if type(error).__name__ == "NoArgsIsHelpError":
            error.show()
            sys.exit(0)
        context = getattr(error, "ctx", None)
        command = context.command_path if context is not None else "zero-lab"
        print(f"error: {error.format_message().rstrip('.')}. See '{command} --help'", file=sys.stderr)
        sys.exit(2)
    sys.exit(result if isinstance(result, int) else 0)


if __name__ == "__main__":
    main()
