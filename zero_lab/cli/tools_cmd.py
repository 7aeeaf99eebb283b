"""`zero-lab estimate`, `zero-lab doctor` and `zero-lab config official`.

    zero-lab estimate --model qwen3-0.6b --gpus 1,2,8 --stages 0,1,2,3 --dtype bfloat16
    zero-lab estimate --model qwen3-0.6b --gpus 1,4 --stages 2,3 --offload optimizer
    zero-lab estimate --model small --gpus 2 --stages 0,1,2,3 --dtype float32 --seq-len 128 --micro-batch 4
    zero-lab doctor
    zero-lab config official harness/configs/zero2.json --device cpu
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from zero_lab.launch import torchrun
from zero_lab.nano.dtypes import PRECISION_OF_DTYPE_NAME
from zero_lab.analysis.estimate import MIB, OFFLOADS, estimate_rows, parse_param_count
from zero_lab.workload.model_shapes import DEFAULT_SEQ_LEN
from zero_lab.analysis.markdown import fmt
from zero_lab.cli import output, plan, preflight
from zero_lab.cli.environment import DEVICES, cpu_cores, cuda_devices, environment, resolve_device
from zero_lab.cli.errors import BadInput, check_choice, check_positive, one_line_errors, parse_int_list

ESTIMATE_FORMATS = ("table", "json")
OFFLOAD_STAGES = {"none": (0, 1, 2, 3), "optimizer": (1, 2, 3), "param": (3,)}
config_app = typer.Typer(help="DeepSpeed config tools.", no_args_is_help=True)


def count_parameters(model: str) -> tuple[int, int, list[tuple[int, str]]]:
    """(parameters, largest layer's own parameters, stage 3's flat buffers) of a preset or local
    HF model, built on meta; the buffers follow the harness's zero3.json (its persistence threshold).

    Presets come from the workload's own build_model (the model a run trains); a directory from its
    config alone, since from_pretrained would read the weights."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from zero_lab.nano.config_loading import load_config
    from zero_lab.workload.models import PRESETS, build_model, check_model_name
    from zero_lab.workload.state_formula import flat_buffers

    check_model_name(model, flag="--model")
    with torch.device("meta"):
        if model in PRESETS:
            network = build_model(model, seed=0)
        else:
            try:
                network = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model, local_files_only=True))
            except (OSError, ValueError) as error:  # what Hugging Face raises for a config it cannot read
                problem = (str(error).strip().splitlines() or [type(error).__name__])[0].rstrip(".")
                raise BadInput(f"cannot read the model config in {model}: {problem}",
                               "give a Hugging Face model directory or a parameter count (600M, 1.5B)")
    total = sum(parameter.numel() for parameter in network.parameters())
    largest = max(sum(p.numel() for p in module.parameters(recurse=False)) for module in network.modules())
    stage3 = load_config(json.loads(plan.default_config_path(3).read_text()))
    return total, largest, flat_buffers(network, stage3)


def activation_figures(model: str, precision: str, seq_len: int, micro_batch: int, attention: str,
                       gradient_checkpointing: bool, rows: list[dict]) -> str | None:
    """Add each row's activations and predicted peak (nano, one rank) in place; the reason when the
    model has no architecture to count them from (a bare parameter count, an unknown model_type)."""
    from zero_lab.analysis.activation_memory import decoder_shape
    from zero_lab.analysis.peak_memory import predict_peak

    try:
        shape = decoder_shape(model) if parse_param_count(model) is None else None
    except ValueError as error:
        raise BadInput(str(error), "give a Hugging Face model directory with a readable config.json")
    bucket = harness_config()["zero_optimization"]["reduce_bucket_size"]
    for row in rows:
        prediction = predict_peak(shape, row["stage"], precision, row["world_size"], seq_len, micro_batch,
                                  attention, gradient_checkpointing, reduce_bucket_size=bucket) if shape else None
        row["activations_mb"] = prediction.activations / MIB if prediction else None
        row["predicted_peak_mb"] = prediction.peak / MIB if prediction else None
        row["peak_moment"] = prediction.moment if prediction else None
    if shape is None:
        return "activations need an architecture: give a preset or a Qwen3/Llama model directory"
    return None


def harness_config() -> dict:
    """The harness's default stage-2 config: its micro-batch and bucket size are the estimate's."""
    return plan.load_config_file(plan.default_config_path(2))


@one_line_errors
def estimate(
    model: Annotated[str, typer.Option(help="Preset, local HF directory, or a parameter count (600M, 1.5B, 7e9).")] = "qwen3-0.6b",
    gpus: Annotated[str, typer.Option(help="World sizes, e.g. 1,2,8.")] = "1,2,8",
    stages: Annotated[Optional[str], typer.Option(help="ZeRO stages, e.g. 0,1,2,3. Default: every stage the offload applies to.")] = None,
    dtype: Annotated[str, typer.Option(help="float32, bfloat16 or float16.")] = "bfloat16",
    offload: Annotated[str, typer.Option(help="none, optimizer (stages 1-3) or param (stage 3: parameters and optimizer).")] = "none",
    seq_len: Annotated[int, typer.Option(help="Tokens per sample, for activations.")] = DEFAULT_SEQ_LEN,
    micro_batch: Annotated[Optional[int], typer.Option(help="Samples per rank per micro-step, for activations (default: the harness config's).")] = None,
    attn_impl: Annotated[str, typer.Option(help="Attention implementation: sdpa, eager or flash_attention_2.")] = "sdpa",
    gradient_checkpointing: Annotated[bool, typer.Option(help="Activations with gradient checkpointing.")] = False,
    format: Annotated[str, typer.Option(help="table or json.")] = "table",
    device_memory: Annotated[Optional[float], typer.Option(
        help="Judge each row against this memory, in GB: per GPU, or the host's for CPU ranks "
             "(default: this machine's free GPU memory, else its available host memory).", metavar="GB")] = None,
) -> None:
    """Model-state MB per rank (ZeRO paper formula, nano's formula, official DeepSpeed's estimator),
    and nano's predicted peak: model states, activations and the loss's temporaries.

    nano's model states are per place (device, host) and, at stage 3, from its own units of the
    model (a bare parameter count has none). Official DeepSpeed's estimators assume 16-bit training
    (stage 2 in code: 2P + 18P/N), have none for stages 0 and 1, and give host bytes per node.
    Activations need the architecture (a preset or a model directory); the predicted peak counts
    every model state as if in one memory, as on a CPU (with offload on a GPU, read nano states MB).
    The last column is the preflight's verdict for the predicted peak (`run` and `compare` refuse
    "will not fit"): per GPU on a CUDA machine, all of a row's ranks on the host otherwise.
    """
    from zero_lab.analysis.activation_memory import ATTENTION_IMPLEMENTATIONS

    check_choice(dtype, "--dtype", tuple(PRECISION_OF_DTYPE_NAME))
    check_choice(offload, "--offload", OFFLOADS)
    check_choice(format, "--format", ESTIMATE_FORMATS)
    check_choice(attn_impl, "--attn-impl", ATTENTION_IMPLEMENTATIONS)
    check_positive(device_memory, "--device-memory")
    if seq_len < 2:
        raise BadInput(f"--seq-len {seq_len} is below 2", "give --seq-len 2 or more")
    if micro_batch is not None and micro_batch < 1:
        raise BadInput(f"--micro-batch {micro_batch} is below 1", "give --micro-batch 1 or more")
    micro_batch = micro_batch or int(harness_config()["train_micro_batch_size_per_gpu"])
    world_sizes = parse_int_list(gpus, "--gpus", range(1, 1 << 20))
    stage_list = parse_int_list(stages, "--stages", range(0, 4)) if stages else list(OFFLOAD_STAGES[offload])
    check_offload_stages(offload, stage_list)
    numel, largest, buffers = parse_param_count(model), None, None
    if numel is None:
        numel, largest, buffers = count_parameters(model)
    device = "cuda" if cuda_devices() else "cpu"
    os.environ.setdefault("DS_ACCELERATOR", device)
    precision = PRECISION_OF_DTYPE_NAME[dtype]
    rows = estimate_rows(numel, world_sizes, stage_list, precision, largest, stage3_buffers=buffers, offload=offload)
    note = activation_figures(model, precision, seq_len, micro_batch, attn_impl, gradient_checkpointing, rows)
    offered_name = preflight.add_row_verdicts(rows, device, device_memory, offload)
    if format == "json":
        output.print_json({"model": model, "params": numel, "largest_layer_params": largest, "offload": offload,
                           "seq_len": seq_len, "micro_batch": micro_batch, "attn_impl": attn_impl,
                           "gradient_checkpointing": gradient_checkpointing, "memory_offered": offered_name,
                           "rows": rows})
        return
    with_host = offload != "none"
    headers = ["world size", "stage", "ZeRO paper MB", "nano states MB (step's most)",
               *(["nano host MB"] if with_host else []),
               "official estimator MB", *(["official host MB / node"] if with_host else []), "activations MB",
               "predicted peak MB", f"fits in {offered_name}"]
    body = [[str(r["world_size"]), str(r["stage"]), fmt(r["paper_mb"]), fmt(r["nano_mb"]),
             *([fmt(r["nano_host_mb"])] if with_host else []), fmt(r["official_estimator_mb"]),
             *([fmt(r["official_estimator_host_mb_per_node"])] if with_host else []), fmt(r["activations_mb"]),
             fmt(r["predicted_peak_mb"]), r["fit"]] for r in rows]
    title = f"{model}: {numel:,} parameters, {dtype}, micro-batch {micro_batch} x {seq_len} tokens, per rank" + (
        f", {offload} offloaded to the host" if with_host else "")
    output.print_table(headers, body, title=title)
    if note:
        output.stderr.print(f"note: {note}", markup=False)
    if any(row["stage"] == 3 for row in rows):
        output.stderr.print("note: at stage 3 the two columns count different moments: nano states MB is the most "
                            "the model states reach anywhere in a step (mid-backward: every gradient partition, the "
                            "root and the largest block gathered); the predicted peak is the largest of its named "
                            "moments (the turn to backward with the activations, the end of backward, the step), each "
                            "with the states held then, when fewer blocks are gathered, so it can be the smaller",
                            markup=False)
    if device == "cpu":
        output.stderr.print("note: fits: a row's ranks share the host's memory (its world size times the predicted "
                            "peak); `run` and `compare` refuse \"will not fit\" without --force", markup=False)


def check_offload_stages(offload: str, stage_list: list[int]) -> None:
    """The stages an offload applies to, as nano and official DeepSpeed accept them."""
    allowed = OFFLOAD_STAGES[offload]
    refused = [stage for stage in stage_list if stage not in allowed]
    if refused:
        raise BadInput(f"--offload {offload} does not apply at stage {refused[0]}",
                       f"use --stages {','.join(map(str, allowed))} with --offload {offload}")


OFFICIAL_PROBE = """
import json, deepspeed
from deepspeed.accelerator import get_accelerator
accelerator = get_accelerator()
print(json.dumps({"accelerator": accelerator.device_name(), "bf16": bool(accelerator.is_bf16_supported()),
                  "fp16": bool(accelerator.is_fp16_supported())}))
"""


def probe_official(device: str) -> dict:
    """Ask official DeepSpeed, in a child process with the harness's environment, what it supports."""
    env = torchrun.launch_environment(dict(os.environ), device, 1, cpu_cores())
    try:
        done = subprocess.run([sys.executable, "-c", OFFICIAL_PROBE], capture_output=True, text=True, env=env, timeout=120)
    except subprocess.TimeoutExpired:
        return {"error": "importing deepspeed took over 120 s"}
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        return {"error": (done.stderr.strip().splitlines() or ["no output"])[-1]}
    return json.loads(lines[-1])


def doctor_checks() -> list[tuple[str, bool, str, str]]:
    """(check, ok, detail, fix) for everything a comparison needs."""
    import torch.distributed as dist

    env = environment("auto")
    device = "cuda" if env["gpus"] != "none" else "cpu"
    official = probe_official(device)
    checks = [
        ("python", sys.version_info >= (3, 10), env["python"], "use Python 3.10 or newer"),
        ("torch", env["torch"] is not None, str(env["torch"]), "make setup (or pip install torch)"),
        ("transformers", env["transformers"] is not None, str(env["transformers"]), "pip install transformers"),
        ("deepspeed", env["deepspeed"] is not None, str(env["deepspeed"]), "pip install 'deepspeed>=0.19,<0.20'"),
        ("devices", True, f"{env['cpu_cores']} CPU cores ({env['cpu']}); GPUs: {env['gpus']}", ""),
        ("gloo backend", dist.is_gloo_available(), "CPU collectives", "install a torch build with gloo"),
        ("nccl backend", device == "cpu" or dist.is_nccl_available(), "GPU collectives" if device == "cuda" else "not needed on CPU",
         "install a CUDA build of torch"),
        ("harness", torchrun.TRAIN_SCRIPT.is_file(), str(torchrun.TRAIN_SCRIPT), "reinstall zero-lab: pip install -e . (or pip install .)"),
        ("official DeepSpeed runs here", "error" not in official,
         official.get("error") or f"accelerator {official.get('accelerator')}", "see the error; on CPU set DS_ACCELERATOR=cpu"),
        ("official bf16", bool(official.get("bf16")), "bf16 supported" if official.get("bf16") else "not supported",
         "use --dtype float32"),
        ("official fp16", bool(official.get("fp16")), "fp16 supported" if official.get("fp16") else
         f"not supported on this {device.upper()} (Type fp16 is not supported on your device)", "use --dtype bfloat16 or float32"),
        ("TORCH_EXTENSIONS_DIR", True, os.environ.get("TORCH_EXTENSIONS_DIR", "unset (DeepSpeed builds ops under ~/.cache)"), ""),
        *toolkit_checks(device),
    ]
    return checks


def toolkit_checks(device: str, environ=os.environ, which=shutil.which) -> list[tuple[str, bool, str, str]]:
    """On a GPU machine: CUDA_HOME, nvcc and ninja, which official DeepSpeed needs to build FusedAdam
    (without them official runs torch's AdamW; cuda_toolkit.py). Not needed on CPU."""
    from zero_lab.workload import cuda_toolkit

    if device != "cuda":
        return [(name, True, "not needed on CPU", "") for name in ("CUDA_HOME", "nvcc", "ninja")]
    fallback = " (else official runs torch.optim.AdamW instead of FusedAdam)"
    home = cuda_toolkit.cuda_home(environ, which)
    nvcc = home / "bin" / "nvcc" if home else None
    ninja = which("ninja")
    return [
        ("CUDA_HOME", home is not None, str(home) if home else "not found", "install the CUDA toolkit and set CUDA_HOME" + fallback),
        ("nvcc", bool(nvcc and nvcc.is_file()), str(nvcc) if nvcc and nvcc.is_file() else "not found",
         "install the CUDA toolkit matching torch's CUDA" + fallback),
        ("ninja", ninja is not None, ninja or "not on PATH", "pip install ninja" + fallback),
    ]


REQUIRED = {"python", "torch", "deepspeed", "transformers", "gloo backend", "harness"}


def doctor() -> None:
    """Versions, devices and backends, and whether official DeepSpeed (and fp16) can run here."""
    checks = doctor_checks()
    body = [[name, "ok" if ok else ("PROBLEM" if name in REQUIRED else "warning"), detail, "" if ok else fix]
            for name, ok, detail, fix in checks]
    output.print_table(["check", "status", "detail", "fix"], body, title="zero-lab doctor", numeric=False)
    raise typer.Exit(0 if all(ok for name, ok, _, _ in checks if name in REQUIRED) else 1)


@config_app.command("official")
@one_line_errors
def config_official(
    path: Annotated[Path, typer.Argument(help="A nano DeepSpeed JSON config.")],
    device: Annotated[str, typer.Option(help="cpu or cuda (auto: what this machine has).")] = "auto",
) -> None:
    """Print the config official DeepSpeed accepts, derived from a nano config."""
    from zero_lab.workload.run_config import check_value_types

    device = resolve_device(check_choice(device, "--device", DEVICES))
    config = plan.load_config_file(path)
    from zero_lab.nano.config_loading import without_official_only_keys
    from zero_lab.nano.official_config import to_official_config

    official = to_official_config(config, device=device)  # official's own keys pass through as they are
    check_value_types(without_official_only_keys(config), where=f"{path}: ")
    print(json.dumps(official, indent=2))
