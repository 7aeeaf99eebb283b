"""`zero-lab explain`: one optimizer step of nano, phase by phase, with the bytes of your model.

    zero-lab explain --model qwen3-0.6b --stage 2 --gpus 4 --dtype bfloat16
    zero-lab explain --model qwen3-0.6b --stage 3 --gpus 4 --format json
    zero-lab explain --model tiny --stage 2 --gpus 2 --dtype float32 --measure
    zero-lab explain --model qwen3-0.6b --stage 3 --gpus 2 --plot step.png
    zero-lab explain --stage 2 --reading-path

Phase 1: the config the harness would train with (its own builder: --stage, --dtype, --offload
         applied to --config or harness/configs/zero<stage>.json), loaded as nano loads it.
Phase 2: the model's parameter table (presets: pure data; a local directory: built on the meta
         device) and the walk-through (`analysis.explain.explain`): nothing launched, no torch for a preset.
         --plot FILE draws it (`analysis.explain.explain_plot`).
Phase 3 (--measure): the same stage on the `tiny` preset, one process per rank on CPU
         (`workload.tracing.step_trace`), its recorded step printed beside the prediction; exit 1 when
         they disagree, 3 when the run fails.
--reading-path prints, instead of the step, what to read to understand the stage's code: the
modules zero_lab/nano/stage<N>.py imports, in reading order, with their lines (`analysis.explain.reading_path`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from zero_lab.analysis.explain.explain import explain as walk_through
from zero_lab.analysis.explain.explain_check import (collectives_comparison, disagreements, memory_comparison,
                                             recorded_sequence)
from zero_lab.analysis.explain.explain_tables import (collectives_table, holdings_table, peak_line, phases_table,
                                              render_markdown, title)
from zero_lab.analysis.explain.gathered_over_step import gathered_over_step, gathered_table, gathered_title
from zero_lab.analysis.report.markdown import markdown_table
from zero_lab.analysis.explain.reading_path import path_table, reading_path
from zero_lab.analysis.explain.reading_path import title as reading_path_title
from zero_lab.cli import input_checks, output
from zero_lab.cli.errors import (EXIT_GATE, EXIT_RUN_FAILED, BadInput, check_choice, check_picture_path,
                                 one_line_errors)
from zero_lab.nano.config.keys import OFFLOAD_SECTIONS
from zero_lab.workload.optimizer_choice import OPTIMIZERS
from zero_lab.nano.dtypes import PRECISION_OF_DTYPE_NAME
from zero_lab.workload.nodes import RANKS_PER_NODE_FIX, ranks_per_node_problem

FORMATS = ("table", "json", "markdown")
MEASURED_PRESET = "tiny"
MEASURE_SEQ_LEN = 32
MEASURE_TIMEOUT_S = 600


def explained_config(config: Optional[Path], stage: int, dtype: str, offload: str, world_size: int,
                     optimizer: Optional[str] = None):
    """Phase 1: (the config dict, nano's typed config of it, where it came from)."""
    from zero_lab.nano.config import load_config

    source = config or input_checks.default_config_path(stage)
    staged = input_checks.config_for_stage(input_checks.load_config_file(source), stage)
    flags = ["--zero-stage", str(stage), "--model-dtype", dtype, "--offload", offload]
    flags += ["--optimizer", optimizer] if optimizer else []
    built = input_checks.built_by_harness(staged, lambda path: ["--deepspeed_config", str(path), *flags], world_size,
                                          source)
    typed = load_config(built, world_size=world_size)
    if typed.zero_optimization.leaf_module is not None:
        raise BadInput(f"{source} sets zero_optimization.leaf_module, which explain does not model",
                       "remove it for explain (each module's own parameters are then a unit)")
    return built, typed, str(source)


def model_table(model: str):
    """Phase 2's input: (parameter entries, stage-3 blocks) of a preset or a local directory."""
    from zero_lab.workload.errors import WorkloadError
    from zero_lab.workload.model_shapes import PRESETS, check_model_name, preset_blocks, preset_parameters

    try:
        check_model_name(model, flag="--model")
        if model in PRESETS:
            return preset_parameters(model), preset_blocks(model)
        from zero_lab.workload.models import directory_parameters

        return directory_parameters(model)
    except WorkloadError as error:
        raise BadInput(error.problem, error.fix) from None


def measure(config: dict, dtype: str, world_size: int) -> dict:
    """Phase 3: run `workload.tracing.step_trace` on `world_size` local processes; rank 0's record.
    The ranks join a store this process binds to a port the OS gives it in the same call, as torchrun's
    agent does (a port probed free and bound later by rank 0 can be taken in between)."""
    from torch.distributed import TCPStore

    store = TCPStore("127.0.0.1", 0, world_size, is_master=True, wait_for_workers=False)
    port = store.port
    request = json.dumps({"config": config, "dtype": dtype, "seq_len": MEASURE_SEQ_LEN})
    processes = []
    try:
        for rank in range(world_size):
            env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": str(rank),
                   "WORLD_SIZE": str(world_size), "LOCAL_RANK": str(rank), "OMP_NUM_THREADS": "1",
                   "TORCHELASTIC_USE_AGENT_STORE": "True"}
            processes.append(subprocess.Popen([sys.executable, "-m", "zero_lab.workload.tracing.step_trace", request],
                                              env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        finished = [process.communicate(timeout=MEASURE_TIMEOUT_S) for process in processes]
    except subprocess.TimeoutExpired:
        output.stderr.print(f"error: the measurement did not finish in {MEASURE_TIMEOUT_S} s", markup=False)
        raise typer.Exit(EXIT_RUN_FAILED)
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait()
    failed = [(rank, errors) for rank, (process, (_, errors)) in enumerate(zip(processes, finished))
              if process.returncode != 0]
    if failed:
        rank, errors = failed[0]
        last = (errors.strip().splitlines() or ["no output"])[-1]
        output.stderr.print(f"error: the measurement failed on rank {rank}: {last}", markup=False)
        raise typer.Exit(EXIT_RUN_FAILED)
    return json.loads(finished[0][0].strip().splitlines()[-1])


@one_line_errors
def explain(
    model: Annotated[str, typer.Option(help="Preset (tiny, small, qwen3-0.6b) or a local Hugging Face directory.")] = "qwen3-0.6b",
    stage: Annotated[int, typer.Option(help="ZeRO stage 0-3.")] = 2,
    gpus: Annotated[int, typer.Option(help="World size N: ranks the step is split over.")] = 2,
    dtype: Annotated[str, typer.Option(help="float32, bfloat16 or float16.")] = "bfloat16",
    config: Annotated[Optional[Path], typer.Option(help="A nano DeepSpeed JSON (default harness/configs/zero<stage>.json).")] = None,
    offload: Annotated[str, typer.Option(help="CPU offload: none, optimizer or param (stage 3).")] = "none",
    format: Annotated[str, typer.Option(help="table, json or markdown.")] = "table",
    measure_tiny: Annotated[bool, typer.Option("--measure", help="Also run the stage on the tiny preset at W=N on CPU and check the prediction.")] = False,
    ranks_per_node: Annotated[Optional[int], typer.Option(help="Nodes of K consecutive ranks: split the wire bytes into intra- and inter-node (default: one node).", metavar="K")] = None,
    plot: Annotated[Optional[Path], typer.Option(help="Also draw the step as a PNG: who holds what per rank, what one rank holds at each moment, what it sends per phase.", metavar="FILE")] = None,
    show_reading_path: Annotated[bool, typer.Option("--reading-path", help="Print instead what to read to understand the stage's code: the modules zero_lab/nano/stage<N>.py imports, in reading order, with their lines.")] = False,
    optimizer: Annotated[Optional[str], typer.Option(help="adamw, or muon: Muon's momentum and its gathers of whole matrices (docs/muon.md). Default: the config's optimizer.")] = None,
    gathered: Annotated[bool, typer.Option("--gathered", help="Stage 3: print instead what stays gathered once each decoder layer's forward and backward is done (the fetch rules at work).")] = False,
) -> None:
    """One optimizer step of nano as a sequence of phases: what one rank holds and what moves
    (payload and wire bytes), from nano's own formula and bucket layout. Nothing is launched
    unless --measure."""
    check_choice(format, "--format", FORMATS)
    check_choice(dtype, "--dtype", tuple(PRECISION_OF_DTYPE_NAME))
    check_choice(offload, "--offload", tuple(OFFLOAD_SECTIONS))
    input_checks.check_stage(stage, "--stage")
    if show_reading_path:
        if measure_tiny:
            raise BadInput("--reading-path prints the code's reading order and runs nothing", "drop --measure")
        print_reading_path(stage, format)
        return
    if gpus < 1:
        raise BadInput(f"--gpus must be 1 or more, not {gpus}", "give the world size, e.g. --gpus 4")
    problem = ranks_per_node_problem(ranks_per_node, gpus)
    if problem:
        raise BadInput(problem, RANKS_PER_NODE_FIX)
    if plot is not None:
        check_picture_path(plot, "--plot")
    if optimizer is not None:
        check_choice(optimizer, "--optimizer", OPTIMIZERS)
    if gathered and (stage != 3 or measure_tiny or plot is not None):
        raise BadInput("--gathered shows stage 3's fetch rules and runs or draws nothing",
                       "give --stage 3, without --measure and --plot")
    built, typed, source = explained_config(config, stage, dtype, offload, gpus, optimizer)
    entries, blocks = model_table(model)
    if gathered:
        print_gathered(gathered_over_step(model, entries, blocks, typed, gpus), source, format)
        return
    walk = walk_through(model, entries, blocks, typed, gpus, ranks_per_node)
    if plot is not None:
        from zero_lab.analysis.explain.explain_plot import plot_walkthrough

        output.stderr.print(f"drew {plot_walkthrough(walk, plot)}", markup=False)
    result = walk.to_json()
    verdict = None
    if measure_tiny:
        prediction = walk if model == MEASURED_PRESET else walk_through(
            MEASURED_PRESET, *model_table(MEASURED_PRESET), typed, gpus, ranks_per_node)
        record = measure(built, dtype, gpus)
        problems = disagreements(prediction.to_json(), record)
        verdict = {"model": MEASURED_PRESET, "prediction": prediction.to_json(), "recorded": record,
                   "disagreements": problems, "agrees": not problems}
        result["measurement"] = verdict
    if format == "json":
        output.print_json(result)
    elif format == "markdown":
        print(render_markdown(walk, source, measurement_markdown(verdict) if verdict else []), end="")
    else:
        print_walk(walk, source, verdict)
    if verdict is not None and not verdict["agrees"]:
        raise typer.Exit(EXIT_GATE)


def print_gathered(result: dict, source: str, format: str) -> None:
    if format == "json":
        output.print_json(result)
    elif format == "markdown":
        print(f"{gathered_title(result, source)}\n\n{markdown_table(*gathered_table(result))}")
    else:
        output.stdout.print(gathered_title(result, source), markup=False)
        output.print_table(*gathered_table(result), title="What stays gathered, layer by layer (MB)")


def print_reading_path(stage: int, format: str) -> None:
    path = reading_path(stage)
    if format == "json":
        output.print_json(path.to_json())
    elif format == "markdown":
        print(f"{reading_path_title(path)}\n\n{markdown_table(*path_table(path))}")
    else:
        output.stdout.print(reading_path_title(path), markup=False)
        output.print_table(*path_table(path), title=f"Stage {stage}'s reading path")


def print_walk(walk, source: str, verdict: dict | None) -> None:
    output.stdout.print(title(walk, source), markup=False)
    output.print_table(*phases_table(walk), title="The step, phase by phase", numeric=False)
    output.print_table(*holdings_table(walk), title="What one rank holds (MB)")
    output.stdout.print(peak_line(walk), markup=False)
    output.print_table(*collectives_table(walk.to_json()["collectives"]),
                       title="What moves (payload: the whole array; wire: what one rank sends)", numeric=False)
    if walk.ranks_per_node:
        output.stdout.print(node_split_line(walk.to_json()), markup=False)
    if verdict is None:
        return
    prediction, record = verdict["prediction"], verdict["recorded"]
    output.print_table(*recorded_sequence(record), title=f"--measure: the recorded step ({verdict['model']}, CPU)")
    output.print_table(*collectives_comparison(prediction, record), title="Collectives: predicted vs recorded",
                       numeric=False)
    output.print_table(*memory_comparison(prediction, record), title="Memory after each phase")
    for line in verdict_lines(verdict):
        output.stdout.print(line, markup=False)


def node_split_line(result: dict) -> str:
    """One step's wire bytes of one rank, inside its node and to other nodes."""
    intra = sum(item["wire_intra_bytes"] for item in result["collectives"])
    inter = sum(item["wire_inter_bytes"] for item in result["collectives"])
    return (f"wire bytes per step, nodes of {result['ranks_per_node']} ranks: {intra} intra-node "
            f"({intra / 2**20:.4f} MB), {inter} inter-node ({inter / 2**20:.4f} MB)")


def verdict_lines(verdict: dict) -> list[str]:
    if verdict["agrees"]:
        return ["measurement agrees with the prediction"]
    return ["measurement DISAGREES with the prediction:", *[f"  {problem}" for problem in verdict["disagreements"]]]


def measurement_markdown(verdict: dict) -> list[str]:
    prediction, record = verdict["prediction"], verdict["recorded"]
    return [f"## Measured: {verdict['model']} on CPU", "",
            markdown_table(*collectives_comparison(prediction, record)), "",
            markdown_table(*memory_comparison(prediction, record)), "",
            markdown_table(*recorded_sequence(record)), "", *verdict_lines(verdict), ""]
