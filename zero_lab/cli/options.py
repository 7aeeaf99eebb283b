"""Options shared by `run` and `compare`, declared once so both commands read the same."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from zero_lab.analysis import launch

WORKLOAD = "Workload (identical for every impl)"
LAUNCH = "Launch (torchrun)"

Device = Annotated[str, typer.Option(help="auto, cpu or cuda. On cpu, --gpus N means N processes.", rich_help_panel=LAUNCH)]
Config = Annotated[Optional[Path], typer.Option(help="nano DeepSpeed JSON config; official DeepSpeed gets its converted form. Default: harness/configs/zero<stage>.json.", rich_help_panel=WORKLOAD)]
Model = Annotated[str, typer.Option(help="Preset (tiny ~0.85M, small ~24M, qwen3-0.6b) or a local Hugging Face directory.", rich_help_panel=WORKLOAD)]
Steps = Annotated[int, typer.Option(help="Optimizer steps (not micro-steps).", rich_help_panel=WORKLOAD)]
BatchSize = Annotated[Optional[int], typer.Option(help="Micro-batch size per process (default: the config's).", rich_help_panel=WORKLOAD)]
SeqLen = Annotated[Optional[int], typer.Option(help="Tokens per sample (default: the harness's).", rich_help_panel=WORKLOAD)]
Dtype = Annotated[str, typer.Option(help="Model dtype: float32, bfloat16 or float16 (sets the config's precision).", rich_help_panel=WORKLOAD)]
Seed = Annotated[int, typer.Option(help="Seed for weights and data.", rich_help_panel=WORKLOAD)]
DatasetPath = Annotated[Optional[str], typer.Option(help="LIMA-style JSON or JSONL with a text field (default: built-in corpus).", rich_help_panel=WORKLOAD)]
Out = Annotated[Path, typer.Option(help="Where run directories go.")]
Name = Annotated[Optional[str], typer.Option(help="Run directory name (default: a timestamp and the run's cell).")]
Nnodes = Annotated[Optional[str], typer.Option(help="torchrun --nnodes (multi-node).", rich_help_panel=LAUNCH)]
NodeRank = Annotated[Optional[int], typer.Option(help="torchrun --node-rank.", rich_help_panel=LAUNCH)]
RdzvEndpoint = Annotated[Optional[str], typer.Option(help="torchrun --rdzv-endpoint host:port (multi-node).", rich_help_panel=LAUNCH)]
RdzvId = Annotated[Optional[str], typer.Option(help="torchrun --rdzv-id.", rich_help_panel=LAUNCH)]

DEFAULT_MODEL = "small"  # ~24M parameters: memory differences show, 4 runs x 20 steps fit in ~5 min on 2 cores
DEFAULT_STEPS = 20


def workload(model, steps, batch_size, seq_len, dtype, seed, dataset_path) -> launch.Workload:
    return launch.Workload(model=model, steps=steps, batch_size=batch_size, seq_len=seq_len, dtype=dtype,
                           seed=seed, dataset_path=dataset_path)


def multi_node(nnodes, node_rank, rdzv_endpoint, rdzv_id) -> launch.MultiNode:
    return launch.MultiNode(nnodes=nnodes, node_rank=node_rank, rdzv_endpoint=rdzv_endpoint, rdzv_id=rdzv_id)
