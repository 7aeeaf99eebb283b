"""Check a run's inputs before anything launches, and turn them into launch specs.

Everything here fails with BadInput (exit 2): a missing or malformed config, a config nano or
official DeepSpeed would refuse, an unknown model, fp16 for official DeepSpeed on CPU, more
processes than CUDA devices (the seed's `invalid device ordinal`), an existing or unwritable
run directory.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import json
import shutil
import sys
import tempfile
from pathlib import Path

from zero_lab.analysis.runs import rundir
from zero_lab.launch import moments, torchrun
from zero_lab.cli.environment import cpu_cores, cuda_devices
from zero_lab.cli.errors import BadInput, check_choice
from zero_lab.nano import stages
from zero_lab.nano.dtypes import PRECISION_OF_DTYPE_NAME

IMPLS = ("nano", "official", "fsdp2")


def check_stage(stage: int, source: str) -> int:
    """stage if zero-lab can run it (the stage table's); source says where it came from."""
    refused = stages.refusal(stage)
    if refused:
        problem, _, fix = refused.partition("; ")
        raise BadInput(f"{problem} ({source})", fix)
    return stage


def default_config_path(stage: int) -> Path:
    """The harness's own default for a stage: harness/configs/zero<stage>.json."""
    return torchrun.CONFIG_DIR / f"zero{stage}.json"


def load_config_file(path: Path) -> dict:
    if not path.is_file():
        raise BadInput(f"config {path} does not exist", "pass an existing DeepSpeed JSON file to --config")
    try:
        config = json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise BadInput(f"config {path} is not valid JSON ({error.msg} at line {error.lineno})", "fix the file")
    if not isinstance(config, dict):
        raise BadInput(f"config {path} is not a JSON object", "give a DeepSpeed config object")
    return config


def config_for_stage(base: dict, stage: int) -> dict:
    """The base config with zero_optimization.stage set: --stage/--stages decide, not the file."""
    config = copy.deepcopy(base)
    config.setdefault("zero_optimization", {})["stage"] = stage
    return config


def received_config(staged: dict, spec: torchrun.LaunchSpec, source: Path) -> dict:
    """The config the harness will train with, from its own parser and builder (which validate it
    as nano does): precision from --dtype, batch size from --batch-size, batch sizes inferred."""
    nnodes = spec.multi_node.nnodes or "1"
    world_size = spec.nproc * (int(nnodes) if nnodes.isdigit() else 1)
    return built_by_harness(staged, lambda path: torchrun.train_arguments(dataclasses.replace(spec, config_path=path)),
                          world_size, source)


def built_by_harness(staged: dict, arguments_for, world_size: int, source: Path) -> dict:
    """The harness's builder applied to `staged` with the flags `arguments_for(path)` gives for a
    config file at path. The builder reads a scratch copy; its errors name source, the file the
    user gave (or the default)."""
    from zero_lab.workload.errors import WorkloadError
    from zero_lab.workload.run_config import build_config, build_parser

    with tempfile.TemporaryDirectory() as scratch:
        path = Path(scratch) / "config.json"
        path.write_text(json.dumps(staged))
        try:
            return build_config(build_parser().parse_args(arguments_for(path)), world_size)
        except WorkloadError as error:
            raise BadInput(error.problem.replace(str(path), str(source)), error.fix) from None


def official_config(config: dict, device: str) -> dict:
    """What official DeepSpeed receives: the engine's conversion of the nano config."""
    from zero_lab.nano.facade.official_config import to_official_config

    return to_official_config(config, device=device)


def fsdp2_plan(config: dict, world_size: int, source: Path):
    """How --impl fsdp2 runs this config (zero_lab.fsdp2.config_map), or BadInput naming what FSDP2 lacks."""
    from zero_lab.fsdp2.config_map import map_config
    from zero_lab.nano.errors import NanoConfigError

    try:
        return map_config(config, world_size=world_size)
    except NanoConfigError as error:
        problem, _, fix = str(error).partition("; ")
        raise BadInput(f"{source}: {problem}", fix) from None


def check_model(model: str) -> None:
    from zero_lab.workload.model_shapes import check_model_name

    check_model_name(model, flag="--model")


def check_impls(impls: list[str]) -> None:
    for impl in impls:
        if impl not in IMPLS:
            raise BadInput(f"unknown impl {impl!r}", f"choose from {', '.join(IMPLS)}")


def own_impls(texts: list[str]) -> tuple[list[str], dict[str, Path]]:
    """--impls/--impl items as (names, {name: engine path} of the own engines, NAME=PATH), or BadInput."""
    from zero_lab.workload.engines.own_engine import OWN_IMPL_FIX, impl_problem, split_impl

    names, own = [], {}
    for text in texts:
        problem = impl_problem(text)
        if problem:
            raise BadInput(problem, OWN_IMPL_FIX if "=" in text else f"choose from {', '.join(IMPLS)}, or NAME=PATH")
        name, path = split_impl(text)
        if name in names:
            raise BadInput(f"impl {name} is named twice", "give each impl once, each own engine its own name")
        names.append(name)
        if path is not None:
            own[name] = path
    return names, own


def check_workload(workload: torchrun.Workload, device: str, impls: list[str], model_and_data: bool = True) -> None:
    """The workload's flags; model_and_data False (a user's script chooses its own): precision and batch only."""
    check_choice(workload.dtype, "--dtype", tuple(PRECISION_OF_DTYPE_NAME))
    if workload.dtype == "float16" and device == "cpu" and "official" in impls:
        raise BadInput("official DeepSpeed rejects fp16 on this CPU (Type fp16 is not supported on your device)",
                       "use --dtype bfloat16 or float32 on CPU")
    if workload.steps < 1:
        raise BadInput("--steps must be at least 1", "pass a positive number of optimizer steps")
    if workload.batch_size is not None and workload.batch_size < 1:
        raise BadInput(f"--batch-size {workload.batch_size} is not a micro-batch size", "pass 1 or more")
    if workload.seq_len is not None and workload.seq_len < 2:
        raise BadInput(f"--seq-len {workload.seq_len} leaves no token to predict", "pass 2 or more")
    if model_and_data:
        check_model(workload.model)
        check_dataset(workload)


# The workload flags a user's script decides for itself (compare --script refuses them).
SCRIPT_DECIDES = ("model", "steps", "seq_len", "dataset_path", "seed", "attn_impl", "gradient_checkpointing")


def user_script(path: Path, arguments: list[str], given: set[str]) -> torchrun.UserScript:
    """compare --script: an existing script, no workload flag it decides itself, and no
    --deepspeed_config of its own (zero-lab appends the one it wrote per stage)."""
    if not path.is_file():
        raise BadInput(f"--script {path} is not a file", "give the path of your DeepSpeed training script")
    for name in SCRIPT_DECIDES:
        if name in given:
            flag = "--" + name.replace("_", "-")
            raise BadInput(f"{flag} does not apply with --script: the script chooses its own model, data and steps",
                           f"pass the script its own flags after `--`, or drop {flag}")
    if any(argument.split("=")[0] in ("--deepspeed_config", "--deepspeed-config") for argument in arguments):
        raise BadInput("the script's arguments hold --deepspeed_config, which zero-lab appends itself (the config it "
                       "writes per stage)", "drop it; choose the base config with --config")
    return torchrun.UserScript(path.resolve(), list(arguments))


def check_dataset(workload: torchrun.Workload) -> None:
    """Read, tokenize and filter --dataset-path as every rank will, so that an empty file, a
    malformed line or no usable record stops the command here, not N ranks racing to say so."""
    if workload.dataset_path is None:
        return
    from zero_lab.workload.data import make_batches
    from zero_lab.workload.models import load_tokenizer
    from zero_lab.workload.run_config import build_parser

    args = build_parser().parse_args(torchrun.workload_arguments(workload))
    make_batches(load_tokenizer(args.model_name), args.seq_len, 1, 1, args.seed, args.dataset_path,
                 args.max_samples, args.min_target_tokens)


def check_processes(nproc: int, device: str, multi_node: torchrun.MultiNode) -> None:
    """On CUDA refuse more processes than devices; on CPU warn beyond the core count."""
    if nproc < 1:
        raise BadInput(f"--gpus {nproc} is not a process count", "use 1 or more")
    if device == "cuda":
        visible = len(cuda_devices())
        if visible == 0:
            raise BadInput("--device cuda but no CUDA device is visible", "use --device cpu or check CUDA_VISIBLE_DEVICES")
        if nproc > visible:
            raise BadInput(f"--gpus {nproc} asks for {nproc} processes per node but {visible} CUDA devices are visible",
                           "lower --gpus or set CUDA_VISIBLE_DEVICES (otherwise: invalid device ordinal)")
    elif nproc > cpu_cores():
        print(f"warning: --gpus {nproc} starts {nproc} processes on {cpu_cores()} CPU cores; they will share cores "
              "and step times will not mean much", file=sys.stderr)


def make_spec(
    impl: str,
    stage: int,
    nproc: int,
    device: str,
    run_dir: Path,
    workload: torchrun.Workload,
    multi_node: torchrun.MultiNode,
    extra_torchrun_args: list[str],
    steps: int | None = None,
    stall_timeout_s: float = 0.0,
    host_memory_limit: int | None = None,
    script: torchrun.UserScript | None = None,
) -> torchrun.LaunchSpec:
    """One launch (its port is picked at launch time, by the launcher); steps overrides the workload's (for warm-ups)."""
    if steps is not None:
        workload = dataclasses.replace(workload, steps=steps)
    return torchrun.LaunchSpec(
        impl=impl,
        stage=stage,
        nproc=nproc,
        device=device,
        config_path=run_dir / "config.json",
        workload=workload,
        log_dir=run_dir / "torchrun-logs",
        multi_node=multi_node,
        extra_torchrun_args=extra_torchrun_args,
        stall_timeout_s=stall_timeout_s,
        host_memory_limit=host_memory_limit,
        script=script,
    )


@contextlib.contextmanager
def claimed_directory(out: Path, name: str | None, default_name: str):
    """A new directory of the command's own under --out: out/name, which must not exist yet, or
    out/default_name (numbered -2, -3, ... when another command took it). BadInput when it exists
    or cannot be created. The command runs inside the block; when it leaves by an exception (bad
    input, Ctrl-C, SIGTERM, an exit) before any run started, the directory is removed again:
    nothing launched, nothing left, and `report runs/*` never meets an empty run."""
    try:
        directory = rundir.claim(out, name or default_name, numbered=name is None)
    except FileExistsError:
        raise BadInput(f"{out / name} already exists", "pick another --name or --out (zero-lab never "
                       "writes into an existing directory)") from None
    except OSError as error:
        raise BadInput(f"cannot create a directory in --out {out} ({error.strerror}: {error.filename})",
                       "pass a writable --out") from None
    try:
        moments.reached("directory-claimed")
        yield directory
    except BaseException:
        if not rundir.holds_a_run(directory):  # what is there is ours: configs written before a launch
            shutil.rmtree(directory, ignore_errors=True)
        raise
