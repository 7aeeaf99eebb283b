"""`zero-lab config official`: the config official DeepSpeed accepts, derived from a nano config;
`zero-lab config fsdp2`: how `--impl fsdp2` maps the same config onto FSDP2 (docs/fsdp2.md).

    zero-lab config official harness/configs/zero2.json --device cpu
    zero-lab config fsdp2 harness/configs/zero3.json
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from zero_lab.cli import input_checks
from zero_lab.cli.environment import DEVICES, resolve_device_name
from zero_lab.cli.errors import check_choice, one_line_errors

config_app = typer.Typer(help="DeepSpeed config tools.", no_args_is_help=True)


@config_app.command("official")
@one_line_errors
def config_official(
    path: Annotated[Path, typer.Argument(help="A nano DeepSpeed JSON config.")],
    device: Annotated[str, typer.Option(help="cpu or cuda (auto: what this machine has).")] = "auto",
) -> None:
    """Print the config official DeepSpeed accepts, derived from a nano config."""
    from zero_lab.workload.run_config import check_value_types

    device = resolve_device_name(check_choice(device, "--device", DEVICES))
    config = input_checks.load_config_file(path)
    from zero_lab.nano.config import without_official_only_keys
    from zero_lab.nano.facade.official_config import to_official_config

    official = to_official_config(config, device=device)  # official's own keys pass through as they are
    check_value_types(without_official_only_keys(config), where=f"{path}: ")
    print(json.dumps(official, indent=2))


@config_app.command("fsdp2")
@one_line_errors
def config_fsdp2(
    path: Annotated[Path, typer.Argument(help="A nano DeepSpeed JSON config.")],
    gpus: Annotated[int, typer.Option(help="World size the batch sizes are inferred for.")] = 1,
) -> None:
    """Print how `--impl fsdp2` runs a DeepSpeed config: each key's FSDP2 equivalent, or why none."""
    config = input_checks.load_config_file(path)
    plan = input_checks.fsdp2_plan(config, gpus, path)
    width = max(len(row.key) for row in plan.rows) if plan.rows else 0
    print(f"{'DeepSpeed key':<{width}}  value  ->  FSDP2")
    for row in plan.rows:
        print(f"{row.key:<{width}}  {json.dumps(row.value)}  ->  {row.fsdp2}")
