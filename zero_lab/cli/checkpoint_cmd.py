"""`zero-lab checkpoint inspect|consolidate|reshard|convert`: checkpoints read offline, on one process:
DeepSpeed's (nano's or official's) by `zero_lab.nano.checkpoint.offline`; any of the four formats
(deepspeed, universal, dcp, hf) by `zero_lab.checkpoint_formats` (inspect, convert).

    zero-lab checkpoint inspect runs/ckpt [--plot files.png]
    zero-lab checkpoint convert runs/ckpt --to dcp runs/ckpt-dcp
    zero-lab checkpoint consolidate runs/ckpt --model-name tiny --out weights/model.safetensors
    zero-lab checkpoint reshard runs/ckpt --world-size 3 --out runs/ckpt-w3 --format json

A bad checkpoint or argument is one `error:` line and exit 2; nothing existing is overwritten.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Optional

import typer

from zero_lab.cli import output
from zero_lab.cli.errors import BadInput, check_choice, check_picture_path, one_line_errors

FORMATS = ("table", "json")
checkpoint_app = typer.Typer(help="Inspect, consolidate, reshard or convert a checkpoint (DeepSpeed's, nano's or "
                                  "official's; universal; FSDP2's DCP; Hugging Face weights).",
                             no_args_is_help=True)

Directory = Annotated[Path, typer.Argument(help="The checkpoint directory (holding `latest` and the tags).")]
Tag = Annotated[Optional[str], typer.Option(help="Tag to read (default: the one `latest` names).")]
Format = Annotated[str, typer.Option(help="table or json.")]


def _show(facts: dict, format: str) -> None:
    if format == "json":
        output.print_json(facts)
        return
    rows = [[key, str(value)] for key, value in facts.items() if key not in ("file_bytes", "config")]
    rows += [[f"bytes {name}", f"{size:,}"] for name, size in facts.get("file_bytes", {}).items()]
    output.print_table(["field", "value"], rows, numeric=False)
    if facts.get("config") is not None:
        output.print_json({"config": facts["config"]})


@checkpoint_app.command()
@one_line_errors
def inspect(directory: Directory, tag: Tag = None, format: Format = "table",
            plot: Annotated[Optional[Path], typer.Option(help="Also draw what each file holds, by role, in a PNG.",
                                                         metavar="FILE")] = None) -> None:
    """Format, stage, world size, precision, steps, parameter count, bytes per file, and the config."""
    check_choice(format, "--format", FORMATS)
    if plot is not None:
        check_picture_path(plot, "--plot")
    from zero_lab.checkpoint_formats.convert import describe as describe_any
    facts = describe_any(str(directory), tag)
    if plot is not None and facts["format"] != "deepspeed":
        raise BadInput(f"--plot draws DeepSpeed's rank files; {directory} is a {facts['format']} checkpoint",
                       "drop --plot")
    _show(facts, format)
    if plot is not None:
        from zero_lab.nano.checkpoint.offline import OpenCheckpoint
        checkpoint = OpenCheckpoint.open(str(directory), tag)
        from zero_lab.analysis.report.checkpoint_plot import plot_checkpoint

        output.stderr.print(f"drew {plot_checkpoint(checkpoint, plot)}", markup=False)


@checkpoint_app.command()
@one_line_errors
def consolidate(directory: Directory,
                out: Annotated[Path, typer.Option(help="The .safetensors file to write (must not exist).")],
                model_name: Annotated[Optional[str], typer.Option(
                    help="The preset or Hugging Face directory the run trained: its config.json is written "
                         "beside --out, so from_pretrained(out's directory) loads it.")] = None,
                tag: Tag = None, format: Format = "table") -> None:
    """Whole fp32 weights in one safetensors file (tied aliases kept once, as Hugging Face saves them)."""
    check_choice(format, "--format", FORMATS)
    if out.suffix != ".safetensors":
        raise BadInput(f"--out {out} is not a .safetensors file", "name it like weights/model.safetensors")
    if out.exists():
        raise BadInput(f"--out {out} exists", "choose another path (nothing was overwritten)")
    from safetensors.torch import save_file

    from zero_lab.nano.checkpoint.offline import OpenCheckpoint, consolidate as whole_weights
    checkpoint = OpenCheckpoint.open(str(directory), tag)
    weights = whole_weights(checkpoint)
    aliases = set((checkpoint.model_states.get("shared_params") or {}))
    tensors = {name: values.contiguous() for name, values in weights.items() if name not in aliases}
    config_written = None
    if model_name is not None:
        config_written = _write_model_config(model_name, out.parent)
    out.parent.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out), metadata={"format": "pt"})
    _show({"out": str(out), "tag": checkpoint.tag, "tensors": len(tensors),
           "parameters": sum(values.numel() for values in tensors.values()), "config_json": config_written}, format)


def _write_model_config(model_name: str, directory: Path) -> str:
    """The trained model's config.json beside the weights, as from_pretrained expects."""
    from zero_lab.workload.models import build_model, check_model_name
    check_model_name(model_name)
    target = directory / "config.json"
    if target.exists():
        raise BadInput(f"{target} exists", "choose another --out directory (nothing was overwritten)")
    model = build_model(model_name, seed=0)
    directory.mkdir(parents=True, exist_ok=True)
    model.config.to_json_file(str(target))
    return str(target)


def refuse_output_inside(out: Path, source: Path, name: str) -> None:
    """A new checkpoint written inside the one it is read from would become one of its tags (an OUT
    that exists is refused as existing, by the command's own check)."""
    if not out.exists() and out.resolve().is_relative_to(Path(source).resolve()):
        raise BadInput(f"{name} {out} is inside the checkpoint it reads ({source})",
                       "choose a directory outside it (nothing was written)")


@checkpoint_app.command(name="reshard")
@one_line_errors
def reshard_command(directory: Directory,
                    world_size: Annotated[int, typer.Option(help="The world size to cut the checkpoint for.")],
                    out: Annotated[Path, typer.Option(help="The new checkpoint directory.")],
                    tag: Tag = None, format: Format = "table") -> None:
    """Cut a checkpoint for another world size (partition -> whole parameter -> partition)."""
    check_choice(format, "--format", FORMATS)
    if world_size < 1:
        raise BadInput(f"--world-size {world_size} is not a number of ranks", "pass 1 or more")
    refuse_output_inside(out, directory, "--out")
    from zero_lab.nano.checkpoint.offline import OpenCheckpoint, reshard_checkpoint
    _show(reshard_checkpoint(OpenCheckpoint.open(str(directory), tag), world_size, str(out)), format)


@checkpoint_app.command(name="convert")
@one_line_errors
def convert_command(source: Annotated[Path, typer.Argument(help="The checkpoint to read (its format is detected).")],
                    out: Annotated[Path, typer.Argument(help="The new directory to write (must not exist).")],
                    to: Annotated[str, typer.Option(help="deepspeed, universal, dcp or hf.")],
                    stage: Annotated[Optional[int], typer.Option(
                        help="--to deepspeed: the ZeRO stage (default: the source's, else 2).")] = None,
                    world_size: Annotated[Optional[int], typer.Option(
                        help="--to deepspeed: the ranks to cut for (default: the source's, else 1).")] = None,
                    model_name: Annotated[Optional[str], typer.Option(
                        help="--to hf: the preset or Hugging Face directory trained; its config.json is written "
                             "into OUT, so from_pretrained(OUT) loads it.")] = None,
                    tag: Tag = None, format: Format = "table") -> None:
    """Convert a checkpoint to another engine's format, one tensor at a time, into a new directory."""
    from zero_lab.checkpoint_formats.common import FORMATS as CHECKPOINT_FORMATS

    check_choice(format, "--format", FORMATS)
    check_choice(to, "--to", CHECKPOINT_FORMATS)
    if stage is not None and stage not in (0, 1, 2, 3):
        raise BadInput(f"--stage {stage} is not a ZeRO stage", "pass 0, 1, 2 or 3")
    if world_size is not None and world_size < 1:
        raise BadInput(f"--world-size {world_size} is not a number of ranks", "pass 1 or more")
    if (stage is not None or world_size is not None) and to != "deepspeed":
        raise BadInput(f"--stage and --world-size cut DeepSpeed's files; --to {to} holds whole tensors",
                       "drop them, or pass --to deepspeed")
    if model_name is not None and to != "hf":
        raise BadInput("--model-name writes Hugging Face's config.json", "drop it, or pass --to hf")
    if out.exists():
        raise BadInput(f"OUT {out} exists", "choose a new directory (nothing was written)")
    refuse_output_inside(out, source, "OUT")
    from zero_lab.checkpoint_formats import convert as conversion

    if model_name is not None:
        from zero_lab.workload.models import check_model_name
        check_model_name(model_name)
    converted = conversion.open_source(str(source), tag)
    predicted = conversion.predicted_peak_bytes(converted, to)
    output.stderr.print(f"converting {converted.facts.format} -> {to}: {len(converted.facts.shapes)} tensors, "
                        f"{converted.facts.numel():,} parameters; predicted peak {predicted:,} bytes beyond mapped "
                        f"files (the whole model's fp32 weights and moments: {converted.facts.numel() * 12:,})",
                        markup=False, highlight=False)
    for line in conversion.not_held(converted, to):
        output.stderr.print(f"note: {line}", markup=False, highlight=False)
    options = conversion.Options(stage, world_size,
                                 (lambda directory: _write_model_config(model_name, Path(directory)))
                                 if model_name is not None else None)
    written = conversion.convert(converted, to, str(out), options)
    _show({"source": str(source), "source_format": converted.facts.format, "to": to, "out": str(out),
           "files": len(written), "bytes": sum(os.path.getsize(path) for path in written),
           "predicted_peak_bytes": predicted}, format)
