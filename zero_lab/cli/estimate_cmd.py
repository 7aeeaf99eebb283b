"""`zero-lab estimate`: model-state and peak memory per rank, for each world size and stage.

    zero-lab estimate --model qwen3-0.6b --gpus 1,2,8 --stages 0,1,2,3 --dtype bfloat16
    zero-lab estimate --model qwen3-0.6b --gpus 1,4 --stages 2,3 --offload optimizer
    zero-lab estimate --model small --gpus 2 --stages 0,1,2,3 --dtype float32 --seq-len 128 --micro-batch 4
    zero-lab estimate --model small --gpus 2,4 --stages 2,3 --impls nano,official,fsdp2
    zero-lab estimate --model qwen3-0.6b --gpus 2 --stages 2,3 --plot peaks.png
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Optional

import typer

from zero_lab.analysis.memory.estimate import MIB, OFFLOADS, estimate_rows, parse_param_count
from zero_lab.analysis.report.markdown import fmt
from zero_lab.cli import input_checks, output, preflight
from zero_lab.cli.environment import cuda_devices
from zero_lab.workload.optimizer_choice import OPTIMIZERS
from zero_lab.cli.errors import (BadInput, check_choice, check_picture_path, check_positive, one_line_errors,
                                 parse_int_list)
from zero_lab.cli.model_count import count_parameters
from zero_lab.nano.dtypes import PRECISION_OF_DTYPE_NAME
from zero_lab.workload.model_shapes import DEFAULT_SEQ_LEN

ESTIMATE_FORMATS = ("table", "json")
OFFLOAD_STAGES = {"none": (0, 1, 2, 3), "optimizer": (1, 2, 3), "param": (3,)}


def harness_defaults() -> dict:
    """The harness's default stage-2 config: its micro-batch and bucket size are the estimate's."""
    return input_checks.load_config_file(input_checks.default_config_path(2))


def activation_figures(model: str, precision: str, seq_len: int, micro_batch: int, attention: str,
                       gradient_checkpointing: bool, rows: list[dict]) -> str | None:
    """Add each row's activations and predicted peak (nano, one rank) in place; the reason when the
    model has no architecture to count them from (a bare parameter count, an unknown model_type)."""
    from zero_lab.analysis.memory.activation_memory import decoder_shape
    from zero_lab.analysis.memory.peak_memory import predict_peak

    try:
        shape = decoder_shape(model) if parse_param_count(model) is None else None
    except ValueError as error:
        raise BadInput(str(error), "give a Hugging Face model directory with a readable config.json")
    bucket = harness_defaults()["zero_optimization"]["reduce_bucket_size"]
    for row in rows:
        prediction = predict_peak(shape, row["stage"], precision, row["world_size"], seq_len, micro_batch,
                                  attention, gradient_checkpointing, reduce_bucket_size=bucket) if shape else None
        row["activations_mb"] = prediction.activations / MIB if prediction else None
        row["predicted_peak_mb"] = prediction.peak / MIB if prediction else None
        row["peak_moment"] = prediction.moment if prediction else None
        row["heap_kept_mb"] = prediction.heap_kept / MIB if prediction else None  # on a CPU: freed, still resident
        row["cached_mb"] = prediction.cached / MIB if prediction else None  # on a GPU: freed, still reserved
    if shape is None:
        return "activations need an architecture: give a preset or a Qwen3/Llama model directory"
    return None


def impl_peaks(model: str, precision: str, seq_len: int, micro_batch: int, attention: str, gradient_checkpointing: bool,
               offload: str, device: str, impls: list[str], rows: list[dict]) -> None:
    """Add each row's `predicted_peak_mb_by_impl` (impl -> MB) in place: the peak a run of that impl would
    report as `predicted_peak_mb` on `device` (offload's host bytes apart on CUDA), with the optimizer the
    harness gives it there (its temporaries); and `predicted_reserved_mb_by_impl`, on CUDA what the caching
    allocator would reserve (its `predicted_reserved_mb`; on CPU None). None for an impl without a
    prediction (FSDP2 with offload, an engine of your own) and for a model without an architecture."""
    from zero_lab.analysis.memory.activation_memory import decoder_shape
    from zero_lab.analysis.memory.peak_memory import Offload, adam_temporaries, predict_peak
    from zero_lab.analysis.memory.resident import predicted_resident_bytes

    shape = decoder_shape(model) if parse_param_count(model) is None else None
    config = harness_defaults()
    moved = Offload(optimizer=offload != "none", parameters=offload == "param")
    for row in rows:
        peaks, reserved = {}, {}
        for impl in impls:
            temporaries = adam_temporaries(preflight.expected_optimizer(impl, device, config),
                                           "cpu" if offload != "none" else device)
            prediction = predict_peak(shape, row["stage"], precision, row["world_size"], seq_len, micro_batch, attention,
                                      gradient_checkpointing, reduce_bucket_size=config["zero_optimization"][
                                          "reduce_bucket_size"], impl=impl, offload=moved,
                                      optimizer_temporaries=temporaries) if shape else None
            peaks[impl] = prediction.peak_seen_on(device) / MIB if prediction else None
            reserved[impl] = (predicted_resident_bytes(prediction, impl, device) / MIB
                              if prediction and device == "cuda" else None)
        row["predicted_peak_mb_by_impl"] = peaks
        row["predicted_reserved_mb_by_impl"] = reserved


def fsdp2_figures(model: str, numel: int, offload: str, rows: list[dict]) -> None:
    """Add FSDP2's model-state MB after the backward (its sharded gradients beside parameters and states; zero_lab.fsdp2.memory_formula)
    to each row in place: a preset's own parameter shapes (padding counted), else one flat parameter of
    numel elements; stages 0 and 1 have no FSDP2 equivalent (None)."""
    from zero_lab.fsdp2.memory_formula import moment_bytes
    from zero_lab.workload.model_shapes import PRESETS, preset_parameters

    shapes = [entry.shape for entry in preset_parameters(model)] if model in PRESETS else [(numel,)]
    for row in rows:
        figure = moment_bytes(shapes, row["world_size"], "backward") / MIB if row["stage"] in (2, 3) else None
        row["fsdp2_mb"] = figure if offload == "none" else None
        row["fsdp2_host_mb"] = figure if offload != "none" else None


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
    impls: Annotated[str, typer.Option(help="Impls whose formulas get columns: nano,official; fsdp2 adds FSDP2's "
                                            "(stages 2 and 3, docs/fsdp2.md).")] = "nano,official",
    device_memory: Annotated[Optional[float], typer.Option(
        help="Judge each row against this memory, in GB: per GPU, or the host's for CPU ranks "
             "(default: this machine's free GPU memory, else its available host memory).", metavar="GB")] = None,
    plot: Annotated[Optional[Path], typer.Option(help="Also draw the rows as grouped bars in a PNG.", metavar="FILE")] = None,
    device_kind: Annotated[Optional[str], typer.Option("--device", help="cpu or cuda: where the predicted peak per impl "
                                                        "(JSON predicted_peak_mb_by_impl) is measured. Default: this machine's.")] = None,
    optimizer: Annotated[Optional[str], typer.Option(help="adamw, or muon: nano's states with Muon's momentum for the hidden matrices (docs/muon.md); needs a preset or model directory. Default: adamw.")] = None,
) -> None:
    """Model-state MB per rank (ZeRO paper formula, nano's formula, official DeepSpeed's estimator),
    and nano's predicted peak: model states, activations and the loss's temporaries.

    nano's model states are per place (device, host) and, at stage 3, from its own units of the
    model (a bare parameter count has none). Official DeepSpeed's estimators assume 16-bit training
    (stage 2 in code: 2P + 18P/N), have none for stages 0 and 1, and give host bytes per node.
    Activations need the architecture (a preset or a model directory); the predicted peak counts
    every model state as if in one memory, as on a CPU (with offload on a GPU, read nano states MB).
    The last column is the preflight's verdict for the predicted peak (`run` and `compare` refuse
    "will not fit"): per GPU on a CUDA machine, all of a row's ranks on the host otherwise, each rank
    there also with what its process holds beside its tensors.
    """
    from zero_lab.analysis.memory.activation_memory import ATTENTION_IMPLEMENTATIONS

    check_choice(dtype, "--dtype", tuple(PRECISION_OF_DTYPE_NAME))
    check_choice(offload, "--offload", OFFLOADS)
    check_choice(format, "--format", ESTIMATE_FORMATS)
    check_choice(attn_impl, "--attn-impl", ATTENTION_IMPLEMENTATIONS)
    check_positive(device_memory, "--device-memory")
    if plot is not None:
        check_picture_path(plot, "--plot")
    impl_list = [impl.strip() for impl in impls.split(",") if impl.strip()]
    input_checks.check_impls(impl_list)
    if seq_len < 2:
        raise BadInput(f"--seq-len {seq_len} is below 2", "give --seq-len 2 or more")
    if micro_batch is not None and micro_batch < 1:
        raise BadInput(f"--micro-batch {micro_batch} is below 1", "give --micro-batch 1 or more")
    micro_batch = micro_batch or int(harness_defaults()["train_micro_batch_size_per_gpu"])
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
    if optimizer is not None and check_choice(optimizer, "--optimizer", OPTIMIZERS) == "muon":
        muon_rows(rows, model, dtype, offload)
    note = activation_figures(model, precision, seq_len, micro_batch, attn_impl, gradient_checkpointing, rows)
    impl_peaks(model, precision, seq_len, micro_batch, attn_impl, gradient_checkpointing, offload,
               check_choice(device_kind, "--device", ("cpu", "cuda")) if device_kind else device, impl_list, rows)
    offered_name = preflight.add_row_verdicts(rows, device, device_memory, offload)
    with_fsdp2 = "fsdp2" in impl_list
    if with_fsdp2:
        fsdp2_figures(model, numel, offload, rows)
    title = f"{model}: {numel:,} parameters, {dtype}, micro-batch {micro_batch} x {seq_len} tokens, per rank" + (
        f", {offload} offloaded to the host" if offload != "none" else "")
    if plot is not None:
        from zero_lab.analysis.report.estimate_plot import plot_estimate

        output.stderr.print(f"drew {plot_estimate(title + ' (zero-lab estimate)', rows, plot)}", markup=False)
    if format == "json":
        output.print_json({"model": model, "params": numel, "largest_layer_params": largest, "offload": offload,
                           "seq_len": seq_len, "micro_batch": micro_batch, "attn_impl": attn_impl,
                           "gradient_checkpointing": gradient_checkpointing, "memory_offered": offered_name,
                           "rows": rows})
        return
    with_host = offload != "none"
    headers = ["world size", "stage", "ZeRO paper MB", "nano states MB (step's most)",
               *(["nano host MB"] if with_host else []),
               "official estimator MB", *(["official host MB / node"] if with_host else []),
               *([f"fsdp2 {'host ' if with_host else ''}states MB (after backward)"] if with_fsdp2 else []), "activations MB",
               "predicted peak MB", f"fits in {offered_name}"]
    body = [[str(r["world_size"]), str(r["stage"]), fmt(r["paper_mb"]), fmt(r["nano_mb"]),
             *([fmt(r["nano_host_mb"])] if with_host else []), fmt(r["official_estimator_mb"]),
             *([fmt(r["official_estimator_host_mb_per_node"])] if with_host else []),
             *([fmt(r["fsdp2_host_mb" if with_host else "fsdp2_mb"])] if with_fsdp2 else []), fmt(r["activations_mb"]),
             fmt(r["predicted_peak_mb"]), r["fit"]] for r in rows]
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
    if optimizer == "muon":
        output.stderr.print("note: --optimizer muon: nano states MB counts Muon's momentum (docs/muon.md); the paper's "
                            "and official's columns, and the predicted peak, still count Adam's states", markup=False)
    if device == "cpu":
        output.stderr.print("note: fits: a row's ranks share the host's memory (its world size times the predicted "
                            "peak and what a rank's process holds beside its tensors); `run` and `compare` refuse "
                            "\"will not fit\" without --force", markup=False)


def check_offload_stages(offload: str, stage_list: list[int]) -> None:
    """The stages an offload applies to, as nano and official DeepSpeed accept them."""
    allowed = OFFLOAD_STAGES[offload]
    refused = [stage for stage in stage_list if stage not in allowed]
    if refused:
        raise BadInput(f"--offload {offload} does not apply at stage {refused[0]}",
                       f"use --stages {','.join(map(str, allowed))} with --offload {offload}")


def muon_rows(rows: list[dict], model: str, dtype: str, offload: str) -> None:
    """--optimizer muon: each row's nano figure becomes Muon's (`estimate.muon_nano_bytes`), from the
    model's matrices as explain lays them out; the paper's and official's columns stay Adam's."""
    from zero_lab.analysis.memory.estimate import megabytes, muon_nano_bytes
    from zero_lab.analysis.explain.explain import flat_buffers
    from zero_lab.cli.explain_cmd import explained_config, model_table

    if parse_param_count(model) is not None:
        raise BadInput("--optimizer muon needs the model's matrices, not a parameter count",
                       "give a preset (tiny, small, qwen3-0.6b) or a Hugging Face model directory")
    if offload != "none":
        raise BadInput("nano's Muon does not run with CPU offload", "drop --offload, or use --optimizer adamw")
    entries, blocks = model_table(model)
    for row in rows:
        _, typed, _ = explained_config(None, row["stage"], dtype, "none", row["world_size"], "muon")
        figures = muon_nano_bytes(flat_buffers(entries, blocks, typed, row["world_size"]), row["stage"],
                                  row["precision"], row["world_size"])
        row["optimizer"] = "muon"
        row["nano_mb"], row["nano_host_mb"] = megabytes(figures, "device"), megabytes(figures, "host")
