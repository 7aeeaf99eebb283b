"""Options shared by `run` and `compare`, declared and checked once so both commands read the same.

`@common_options` adds them to a command's signature (Typer builds the options from it) and hands
the command one `common: Common` argument instead: the launch every run of the command shares,
with --device checked and resolved, and the two run-directory options.
"""

from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Optional

import typer

from zero_lab.analysis.memory.activation_memory import ATTENTION_IMPLEMENTATIONS
from zero_lab.launch import torchrun
from zero_lab.cli.environment import DEVICES, resolve_device_name
from zero_lab.cli.errors import check_choice, check_not_negative, check_positive
from zero_lab.cli.errors import BadInput
from zero_lab.cli.jobs import SharedSettings
from zero_lab.nano.config.keys import OFFLOAD_SECTIONS
from zero_lab.workload.optimizer_choice import OPTIMIZERS

WORKLOAD = "Workload (identical for every impl)"
LAUNCH = "Launch (torchrun)"

Device = Annotated[str, typer.Option(help="auto, cpu or cuda. On cpu, --gpus N means N processes.", rich_help_panel=LAUNCH)]
Config = Annotated[Optional[Path], typer.Option(help="nano DeepSpeed JSON config; official DeepSpeed gets its converted form. Default: harness/configs/zero<stage>.json.", rich_help_panel=WORKLOAD)]
Model = Annotated[str, typer.Option(help="Preset (tiny ~0.85M, small ~24M, qwen3-0.6b), a local Hugging Face directory, or a config.json alone (random weights, the byte tokenizer).", rich_help_panel=WORKLOAD)]
Steps = Annotated[int, typer.Option(help="Optimizer steps (not micro-steps).", rich_help_panel=WORKLOAD)]
BatchSize = Annotated[Optional[int], typer.Option(help="Micro-batch size per process (default: the config's).", rich_help_panel=WORKLOAD)]
SeqLen = Annotated[Optional[int], typer.Option(help="Tokens per sample (default: the harness's).", rich_help_panel=WORKLOAD)]
Dtype = Annotated[str, typer.Option(help="Model dtype: float32, bfloat16 or float16 (sets the config's precision).", rich_help_panel=WORKLOAD)]
Seed = Annotated[int, typer.Option(help="Seed for weights and data.", rich_help_panel=WORKLOAD)]
DatasetPath = Annotated[Optional[str], typer.Option(help="LIMA-style JSON or JSONL with a text field (default: built-in corpus).", rich_help_panel=WORKLOAD)]
AttnImpl = Annotated[Optional[str], typer.Option(help="Attention implementation: sdpa, eager or flash_attention_2 (default: Hugging Face's choice, sdpa).", rich_help_panel=WORKLOAD)]
GradientCheckpointing = Annotated[bool, typer.Option(help="Recompute each decoder layer's activations in backward (Hugging Face's gradient_checkpointing_enable): less memory, more compute.", rich_help_panel=WORKLOAD)]
Offload = Annotated[str, typer.Option(help="CPU offload for both impls: optimizer (stages 1-3), param (optimizer and parameters; stage 3) or none.", rich_help_panel=WORKLOAD)]
Out = Annotated[Path, typer.Option(help="Where run directories go.")]
Name = Annotated[Optional[str], typer.Option(help="Run directory name (default: a timestamp and the run's cell).")]
Nnodes = Annotated[Optional[str], typer.Option(help="torchrun --nnodes (multi-node).", rich_help_panel=LAUNCH)]
NodeRank = Annotated[Optional[int], typer.Option(help="torchrun --node-rank.", rich_help_panel=LAUNCH)]
RdzvEndpoint = Annotated[Optional[str], typer.Option(help="torchrun --rdzv-endpoint host:port (multi-node).", rich_help_panel=LAUNCH)]
RdzvId = Annotated[Optional[str], typer.Option(help="torchrun --rdzv-id.", rich_help_panel=LAUNCH)]
StallTimeout = Annotated[float, typer.Option(
    help="Stop a run and exit 3 when no \\[opt_step] line comes for this long, start-up included (0: never).",
    metavar="SECONDS", rich_help_panel=LAUNCH)]
DeviceMemory = Annotated[Optional[float], typer.Option(
    help="The memory the device offers, in GB (2^30 bytes): per GPU on CUDA, the host's on CPU. The preflight "
         "checks each run's predicted peak against it (default: free GPU memory, or available host memory), and on "
         "CPU the memory watch treats it as the ranks' limit.", metavar="GB", rich_help_panel=LAUNCH)]
RanksPerNode = Annotated[Optional[int], typer.Option(
    help="Group the ranks into nodes of K consecutive ranks (on one machine: simulated nodes; --gpus 4 with 2 is two "
         "nodes of two) for the intra-/inter-node wire bytes; must divide the world size. Default: one node per "
         "launcher node.", metavar="K", rich_help_panel=LAUNCH)]
Force = Annotated[bool, typer.Option(help="Run even when a run is predicted not to fit in memory.",
                                     rich_help_panel=LAUNCH)]
MaxRestarts = Annotated[int, typer.Option(
    help="torchrun --max-restarts: when a rank dies, restart every rank up to N times, each time from the newest "
         "complete checkpoint in --save-dir (docs/restarts.md).", metavar="N", rich_help_panel=LAUNCH)]
PeakTflops = Annotated[Optional[float], typer.Option(
    help="The device's peak dense TFLOP/s in the run's dtype, for MFU (default: the table of known GPUs in "
         "docs/throughput.md; on a CPU or an unknown GPU, MFU is n/a unless given).", metavar="TFLOPS",
    rich_help_panel=LAUNCH)]
CheckCollectives = Annotated[bool, typer.Option(
    help="Before every collective, check that all ranks call the same operation on the same shapes and dtypes "
         "(torch's TORCH_DISTRIBUTED_DEBUG=DETAIL): a rank-divergent collective stops the run at once, named, "
         "instead of hanging; slower (docs/doctor.md).", rich_help_panel=LAUNCH)]
OptimizerOption = Annotated[Optional[str], typer.Option(
    "--optimizer", help="adamw, or muon: official DeepSpeed's Muon for the 2-D hidden weights, AdamW for the rest "
    "(nano and official; docs/muon.md). Default: the config's optimizer.", rich_help_panel=WORKLOAD)]

DEFAULT_MODEL = "small"  # ~24M parameters: memory differences show, 4 runs x 20 steps fit in ~5 min on 2 cores
DEFAULT_STEPS = 20
# 30 min, torch's own default process-group timeout: the wait before step 1 (loading a large model
# on every rank, a first-use JIT build of DeepSpeed's ops, NCCL set-up) takes minutes, not half an hour.
DEFAULT_STALL_TIMEOUT_S = 1800.0


@dataclass
class Common:
    """What `@common_options` hands a command: the shared launch, and where its run directories go."""

    shared: SharedSettings
    out: Path
    name: str | None
    force: bool = False  # run even where the preflight predicts no fit
    given: frozenset[str] = frozenset()  # the shared options given on the command line (not defaults)
    requested_device: str = "auto"  # --device as given (shared.device is what it resolved to)


def _option(name: str, annotation: object, default: object) -> inspect.Parameter:
    return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=annotation)


COMMON_OPTIONS = [
    _option("device", Device, "auto"),
    _option("config", Config, None),
    _option("model", Model, DEFAULT_MODEL),
    _option("steps", Steps, DEFAULT_STEPS),
    _option("batch_size", BatchSize, None),
    _option("seq_len", SeqLen, None),
    _option("dtype", Dtype, "float32"),
    _option("seed", Seed, 42),
    _option("dataset_path", DatasetPath, None),
    _option("offload", Offload, "none"),
    _option("attn_impl", AttnImpl, None),
    _option("gradient_checkpointing", GradientCheckpointing, False),
    _option("ranks_per_node", RanksPerNode, None),
    _option("out", Out, Path("runs")),
    _option("name", Name, None),
    _option("nnodes", Nnodes, None),
    _option("node_rank", NodeRank, None),
    _option("rdzv_endpoint", RdzvEndpoint, None),
    _option("rdzv_id", RdzvId, None),
    _option("stall_timeout", StallTimeout, DEFAULT_STALL_TIMEOUT_S),
    _option("device_memory", DeviceMemory, None),
    _option("force", Force, False),
    _option("max_restarts", MaxRestarts, 0),
    _option("optimizer", OptimizerOption, None),
    _option("peak_tflops", PeakTflops, None),
    _option("check_collectives", CheckCollectives, False),
]
# Typer passes the context by its type; its extra arguments (after `--`) go to torchrun.
CONTEXT = inspect.Parameter("context", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=typer.Context)


def common(context: typer.Context, device, config, model, steps, batch_size, seq_len, dtype, seed, dataset_path,
           offload, attn_impl, gradient_checkpointing, ranks_per_node, out, name, nnodes, node_rank, rdzv_endpoint, rdzv_id, stall_timeout, device_memory,
           force, max_restarts=0, optimizer=None, peak_tflops=None, check_collectives=False) -> Common:
    """The shared options as one Common; BadInput for a --device outside auto, cpu, cuda, an
    --attn-impl Hugging Face does not name, a negative --stall-timeout, or a --device-memory that
    is not above 0, or a --peak-tflops that is not above 0."""
    work = torchrun.Workload(model=model, steps=steps, batch_size=batch_size, seq_len=seq_len, dtype=dtype, seed=seed,
                           dataset_path=dataset_path, offload=check_choice(offload, "--offload", tuple(OFFLOAD_SECTIONS)),
                           ranks_per_node=ranks_per_node, gradient_checkpointing=gradient_checkpointing,
                           attn_impl=None if attn_impl is None else check_choice(attn_impl, "--attn-impl",
                                                                                   ATTENTION_IMPLEMENTATIONS))
    work.optimizer = None if optimizer is None else check_choice(optimizer, "--optimizer", OPTIMIZERS)
    node = torchrun.MultiNode(nnodes=nnodes, node_rank=node_rank, rdzv_endpoint=rdzv_endpoint, rdzv_id=rdzv_id)
    requested_device = check_choice(device, "--device", DEVICES)
    device = resolve_device_name(requested_device)
    check_not_negative(stall_timeout, "--stall-timeout")
    check_positive(device_memory, "--device-memory")
    check_positive(peak_tflops, "--peak-tflops")
    work.peak_tflops, work.check_collectives = peak_tflops, check_collectives
    given = frozenset(parameter.name for parameter in COMMON_OPTIONS  # by name: Typer may carry its own Click
                      if getattr(context.get_parameter_source(parameter.name), "name", None) == "COMMANDLINE")
    restarts = checked_max_restarts(max_restarts, list(context.args))
    return Common(SharedSettings(config, device, work, node, list(context.args), stall_timeout, device_memory,
                                 max_restarts=restarts),
                  out, name, force, given, requested_device)


def checked_max_restarts(max_restarts: int, torchrun_arguments: list[str]) -> int:
    """--max-restarts as given: 0 or more, and not also among the torchrun arguments after `--`."""
    check_not_negative(max_restarts, "--max-restarts")
    if max_restarts and any(argument.split("=")[0] in ("--max-restarts", "--max_restarts")
                            for argument in torchrun_arguments):
        raise BadInput("--max-restarts is given twice: as zero-lab's option and after `--` for torchrun",
                       "give it once, as --max-restarts N")
    return max_restarts


def common_options(command):
    """command(own options..., common) -> a Typer command with its own options, then the shared ones."""
    own = [parameter for parameter in inspect.signature(command, eval_str=True).parameters.values()
           if parameter.name != "common"]

    @functools.wraps(command)
    def with_common_options(context: typer.Context, **given):
        shared = {parameter.name: given.pop(parameter.name) for parameter in COMMON_OPTIONS}
        return command(**given, common=common(context, **shared))

    parameters = [CONTEXT, *own, *COMMON_OPTIONS]
    with_common_options.__signature__ = inspect.Signature(parameters)
    with_common_options.__annotations__ = {parameter.name: parameter.annotation for parameter in parameters}
    return with_common_options
