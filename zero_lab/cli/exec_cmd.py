"""`zero-lab exec`: run any command with `import deepspeed` resolving to nano or to official DeepSpeed.

    zero-lab exec --impl nano -- torchrun --nproc-per-node 2 train.py --deepspeed_config ds.json
    zero-lab exec --impl official --device cpu -- python train.py --deepspeed_config ds.json
    zero-lab exec --impl nano --log-contract -- torchrun --nproc-per-node 2 train.py ...  # then zero-lab parse

Phase 1: check the impl, the device and that the command exists (bad input: one line, exit 2).
Phase 2: replace this process with the command (os.execvpe), in the environment
         `zero_lab.launch.engine_switch` builds: the command's exit code is the command's own, and
         signals reach it directly, as if it had been started without zero-lab.
"""

from __future__ import annotations

import os
import shutil
import sys
from typing import Annotated

import typer

from zero_lab.cli.environment import DEVICES, resolve_device_name, say_where_auto_runs
from zero_lab.cli.errors import BadInput, check_choice, one_line_errors
from zero_lab.launch.engine_switch import IMPLS, impl_environment


@one_line_errors
def exec_command(
    context: typer.Context,
    impl: Annotated[str, typer.Option(help="nano or official: which engine `import deepspeed` gives the command.")] = "nano",
    device: Annotated[str, typer.Option(help="auto, cpu or cuda: the accelerator DeepSpeed is told (DS_ACCELERATOR).")] = "auto",
    log_contract: Annotated[bool, typer.Option(help="The engine also prints the log contract (\\[zero], \\[model], "
                                                    "\\[opt_step k], \\[phase], \\[comm]; docs/log-format.md) on rank 0.")] = False,
) -> None:
    """Run a command after `--` with `import deepspeed` resolving to nano or official DeepSpeed.

    Its exit code is the command's own.
    """
    # Phase 1
    check_choice(impl, "--impl", IMPLS)
    requested_device = check_choice(device, "--device", DEVICES)
    device = resolve_device_name(requested_device)
    command = list(context.args)
    if not command:
        raise BadInput("zero-lab exec needs a command after `--`",
                       "for example: zero-lab exec --impl nano -- python train.py --deepspeed_config ds.json")
    if shutil.which(command[0]) is None:
        raise BadInput(f"command {command[0]!r} not found (not an executable file, nor on PATH)",
                       "check its spelling, or give its path")
    # Phase 2
    say_where_auto_runs(requested_device, device)
    env = impl_environment(dict(os.environ), impl, device, log_contract)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execvpe(command[0], command, env)
