"""What a run is, from its flags: the parsed arguments, the device, and the DeepSpeed config each
impl receives; and every bad-input check that can run before anything expensive starts.

Phase 1: `build_parser` reads the seed's flags (same names) plus `--impl` and `--device`.
Phase 2: `rank_device` picks cpu or cuda and refuses more processes than visible GPUs.
Phase 3: `build_config` reads the JSON config and applies the flags that override it
         (`--zero-stage`, `--model-dtype`, `--batch-size`), then validates it as nano does, and
         checks that every value has the JSON type nano's typed config declares. For
         `--impl official` the keys only official DeepSpeed knows are left out of that check and
         passed through to official as they are (`passed_to_official` names them).
Phase 4: `check_launch` adds the checks of the workload itself (model name, official on CPU).
Every problem is a `WorkloadError`, which `harness/train.py` prints as one line and exits 2;
the CLI can call `check_launch` before it spawns torchrun.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from zero_lab.workload.errors import WorkloadError
from zero_lab.nano.config.keys import OFFLOAD_SECTIONS
from zero_lab.nano.dtypes import PRECISION_OF_DTYPE_NAME
from zero_lab.nano.stages import IMPLEMENTED
from zero_lab.workload.model_shapes import DEFAULT_SEQ_LEN, PRESETS, check_model_name
from zero_lab.workload.nodes import RANKS_PER_NODE_FIX, ranks_per_node_problem
from zero_lab.workload.optimizer_choice import OPTIMIZERS, uses_muon, with_optimizer

CONFIG_DIR = Path(__file__).resolve().parents[1] / "harness" / "configs"  # shipped in the package
IMPLS = ("nano", "official", "fsdp2")



def impl_argument(text: str) -> str:
    """--impl's value as given (a built-in impl or NAME=PATH), or argparse's one-line refusal."""
    from zero_lab.workload.engines.own_engine import impl_problem

    problem = impl_problem(text)
    if problem:
        raise argparse.ArgumentTypeError(problem)
    return text


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description="Train one workload with nano or official DeepSpeed; rank 0 prints the log "
                    "contract of docs/log-format.md.")
    add = parser.add_argument
    add("--impl", type=impl_argument, default="nano", metavar="{nano,official,fsdp2,NAME=PATH}",
        help="which engine provides initialize(): zero_lab.nano, official deepspeed, FSDP2 "
             "(torch's fully_shard, the config mapped by zero_lab.fsdp2.config_map), or your own engine "
             "(NAME=PATH: zero_lab/workload/engines/own_engine.py)")
    add("--deepspeed_config", default=None,
        help="DeepSpeed JSON config (default: harness/configs/zero<stage>.json)")
    add("--steps", type=int, default=10, help="optimizer steps (each is gradient_accumulation_steps micro-steps)")
    add("--batch-size", type=int, default=None,
        help="micro batch per rank; overrides train_micro_batch_size_per_gpu")
    add("--seq-len", type=int, default=DEFAULT_SEQ_LEN, help="tokens per sample")
    add("--seed", type=int, default=42, help="seed of the initial weights and of the batches")
    add("--model-name", default="tiny",
        help=f"a preset ({', '.join(PRESETS)}) or a local Hugging Face model directory")
    add("--model-dtype", choices=tuple(PRECISION_OF_DTYPE_NAME), default=None,
        help="parameter dtype; sets the config's fp16/bf16 sections (default: from the config)")
    add("--attn-impl", default=None, help="attention implementation: eager, sdpa, flash_attention_2")
    add("--dataset-path", default=None,
        help="LIMA-style JSON/JSONL conversations or JSONL with 'text' (default: built-in corpus)")
    add("--max-samples", type=int, default=None, help="use at most this many dataset samples")
    add("--min-target-tokens", type=int, default=1,
        help="skip dataset samples with fewer target (unmasked) tokens after truncation")
    add("--zero-stage", type=int, choices=IMPLEMENTED, default=None,
        help="ZeRO stage; must agree with --deepspeed_config when both are given (default: 2)")
    add("--offload", choices=tuple(OFFLOAD_SECTIONS), default="none",
        help="CPU offload: optimizer (offload_optimizer; stages 1-3), param (offload_param and "
             "offload_optimizer; stage 3), none (default: the config's own offload sections)")
    add("--gradient-checkpointing", action="store_true", help="recompute activations in backward")
    add("--local-files-only", action="store_true",
        help="accepted for the seed's commands: models are always read from local files only")
    add("--trust-remote-code", action="store_true", help="allow a local model's own code")
    add("--device", choices=("auto", "cpu", "cuda"), default="auto", help="auto: cuda if available")
    add("--ranks-per-node", type=int, default=None, metavar="K",
        help="group the ranks into nodes of K consecutive ranks for the intra-/inter-node wire bytes (must divide "
             "the world size; default: the launcher's ranks per node)")
    add("--dist-timeout", type=float, default=1800.0,
        help="seconds a collective may wait for the other ranks before this rank gives up "
             "(the process group's timeout; default torch's 30 min)")
    add("--save-dir", default=None,
        help="save DeepSpeed checkpoints here (<dir>/global_step<N>/, <dir>/latest): after the last step, "
             "and every --save-every steps")
    add("--save-every", type=int, default=0, help="also save every K optimizer steps (needs --save-dir)")
    add("--resume", nargs="?", const="latest", default=None, metavar="TAG",
        help="load the checkpoint in --save-dir first (TAG, default the one `latest` names) and continue "
             "from its step up to --steps")
    add("--global-batch-size", type=int, default=None, metavar="N",
        help="keep the global batch at N samples per step whatever the world size (the config's train_batch_size; "
             "gradient accumulation follows): a restart with fewer ranks trains on the same batches")
    add("--optimizer", choices=OPTIMIZERS, default=None,
        help="adamw, or muon: official DeepSpeed's Muon for the 2-D hidden weights and AdamW for the rest "
             "(default: the config's optimizer; docs/muon.md)")
    # DeepSpeed's launcher passes these; accepted and ignored (torchrun's env is what counts).
    add("--deepspeed", action="store_true", help=argparse.SUPPRESS)
    add("--local_rank", "--local-rank", type=int, default=None, help=argparse.SUPPRESS)
    return parser


def rank_device(requested: str, local_world_size: int) -> "torch.device":
    """Phase 2: cpu or cuda; on cuda one device per local process, and no more processes."""
    import torch  # here, not at the top: the CLI builds configs without loading torch

    available = torch.cuda.is_available()
    if requested == "cuda" and not available:
        raise WorkloadError("--device cuda but torch sees no CUDA device",
                            "Use --device cpu, or install a CUDA build of torch")
    if requested == "cpu" or not available:
        return torch.device("cpu")
    if local_world_size > torch.cuda.device_count():
        raise WorkloadError(f"{local_world_size} processes per node but only "
                            f"{torch.cuda.device_count()} visible CUDA devices (the seed's "
                            "'invalid device ordinal')", "Lower --nproc_per_node or check CUDA_VISIBLE_DEVICES")
    return torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))


def _read_json(path: Path) -> dict:
    if not path.is_file():
        raise WorkloadError(f"config file {path} does not exist", "Check --deepspeed_config")
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise WorkloadError(f"config file {path} is not UTF-8 text", "Save it as UTF-8") from None
    except json.JSONDecodeError as error:
        raise WorkloadError(f"config file {path} is not valid JSON ({error.msg} at line "
                            f"{error.lineno})", "Fix the file") from None
    if not isinstance(config, dict):
        raise WorkloadError(f"config file {path} holds a JSON {type(config).__name__}, not an "
                            "object", "Give a DeepSpeed config object {...}")
    return config


def build_config(args: argparse.Namespace, world_size: int) -> dict:
    """Phase 3: the nano config of this run (official gets `to_official_config` of it, with the keys
    only official knows, which nano's checks leave out)."""
    from zero_lab.nano.config import load_config, without_official_only_keys
    from zero_lab.nano.errors import NanoConfigError

    stage = args.zero_stage if args.zero_stage is not None else 2
    path = Path(args.deepspeed_config) if args.deepspeed_config else CONFIG_DIR / f"zero{stage}.json"
    config = _read_json(path)
    if "bfloat16" in config:  # DeepSpeed's alias; one spelling from here on
        config["bf16"] = config.pop("bfloat16")
    zero = config.setdefault("zero_optimization", {})
    if args.zero_stage is not None:
        if "stage" in zero and zero["stage"] != args.zero_stage:
            raise WorkloadError(f"{path} sets zero_optimization.stage {zero['stage']} but "
                                f"--zero-stage is {args.zero_stage}", "Drop one or make them agree")
        zero["stage"] = args.zero_stage
    if args.model_dtype is not None:
        precision = PRECISION_OF_DTYPE_NAME[args.model_dtype]
        for section in ("fp16", "bf16"):
            config.setdefault(section, {})["enabled"] = precision == section
    if args.batch_size is not None:
        config["train_micro_batch_size_per_gpu"] = args.batch_size
        config.pop("train_batch_size", None)  # re-inferred from micro x accumulation x world
    keep_global_batch(config, getattr(args, "global_batch_size", None))
    for section in OFFLOAD_SECTIONS[args.offload]:
        zero[section] = {**zero.get(section, {}), "device": "cpu"}
    config = with_optimizer(config, getattr(args, "optimizer", None))
    checked = without_official_only_keys(config) if args.impl == "official" else config
    try:  # both impls get this config (official through to_official_config), so nano's rules hold
        load_config(checked, world_size=world_size)
    except NanoConfigError as error:
        raise WorkloadError.from_nano(error, where=f"{path}: ") from None
    check_value_types(checked, where=f"{path}: ")
    return config


def keep_global_batch(config: dict, global_batch_size: int | None) -> None:
    """--global-batch-size N: train_batch_size N, and gradient accumulation left for the engine to infer
    (N / (micro batch x world size)), so fewer ranks each accumulate more micro-steps (docs/restarts.md)."""
    if global_batch_size is None:
        return
    config["train_batch_size"] = global_batch_size
    config.pop("gradient_accumulation_steps", None)


def passed_to_official(impl: str, config: dict) -> str | None:
    """With --impl official, the one `[warn]` message naming the keys only official DeepSpeed knows,
    which it receives as they are (nano implements none of them); None when there are none."""
    from zero_lab.nano.config import official_only_keys

    keys = official_only_keys(config) if impl == "official" else []
    if not keys:
        return None
    return (f"config keys {', '.join(keys)} are known to official DeepSpeed but not implemented by nano: "
            "passed through to official DeepSpeed as they are")


def check_value_types(config: dict, where: str = "") -> None:
    """Every value of the JSON type nano's typed config declares, or a WorkloadError naming it.

    nano's loader converts `"4"` to 4 for itself, but the harness and official DeepSpeed read the
    dict as written, where `"4"` is a TypeError on every rank; so the config is validated again,
    strictly. A value "auto" is the loader's to resolve or refuse, and it has done so already.
    """
    from pydantic import ValidationError

    from zero_lab.nano.config import NanoConfig

    try:
        NanoConfig.model_validate_json(json.dumps(config), strict=True)
    except ValidationError as error:
        wrong = [problem for problem in error.errors() if problem.get("input") != "auto"]
        if wrong:
            location = ".".join(str(part) for part in wrong[0]["loc"])
            raise WorkloadError(f"{where}config field '{location}' is {wrong[0]['input']!r}: "
                                f"{wrong[0]['msg'][:1].lower()}{wrong[0]['msg'][1:]}",
                                "Write the value in its JSON type (a number without quotes, true or false)") from None


def precision_of(config: dict) -> str:
    """'fp16', 'bf16' or 'fp32', from the config's precision sections."""
    if config.get("fp16", {}).get("enabled"):
        return "fp16"
    return "bf16" if config.get("bf16", {}).get("enabled") else "fp32"


def check_fsdp2(args: argparse.Namespace, config: dict, world_size: int) -> None:
    """--impl fsdp2: a config FSDP2 can run (stage 2 or 3, no fp16: `config_map`); its checkpoints are DCP's."""
    from zero_lab.fsdp2.config_map import Fsdp2ConfigError, map_config

    try:
        map_config(config, world_size=world_size)
    except Fsdp2ConfigError as error:
        raise WorkloadError.from_nano(error) from None


def check_muon(args: argparse.Namespace, config: dict) -> None:
    """Muon's runs: no checkpoints (nano does not save Muon's momentum)."""
    if not uses_muon(config):
        return
    if args.save_dir or args.resume is not None:
        raise WorkloadError("--save-dir and --resume are not supported with Muon (nano's checkpoints do not hold "
                            "Muon's momentum)", "Drop them, or use --optimizer adamw")


def check_launch(args: argparse.Namespace, world_size: int, local_world_size: int):
    """Phases 2-4: (device, nano config) of a run, or a WorkloadError naming the bad input."""
    if args.steps < 1 or args.seq_len < 2:
        raise WorkloadError("--steps must be >= 1 and --seq-len >= 2", "Raise them")
    if (args.save_every or args.resume is not None) and not args.save_dir:
        raise WorkloadError("--save-every and --resume need --save-dir", "Add --save-dir DIR")
    if args.save_every < 0:
        raise WorkloadError(f"--save-every {args.save_every} is not a number of steps", "Give 0 (off) or more")
    if not args.dist_timeout > 0:
        raise WorkloadError(f"--dist-timeout {args.dist_timeout:g} is not a time to wait", "Give seconds, more than 0")
    check_model_name(args.model_name)
    problem = ranks_per_node_problem(args.ranks_per_node, world_size)
    if problem:
        raise WorkloadError(problem, RANKS_PER_NODE_FIX)
    device = rank_device(args.device, local_world_size)
    config = build_config(args, world_size)
    check_muon(args, config)
    if args.impl == "fsdp2":
        check_fsdp2(args, config, world_size)
    if args.impl == "official" and device.type == "cpu" and precision_of(config) == "fp16":
        raise WorkloadError("official DeepSpeed rejects fp16 on this CPU ('Type fp16 is not "
                            "supported on your device')", "Use --model-dtype bfloat16 or float32 on CPU")
    return device, config
