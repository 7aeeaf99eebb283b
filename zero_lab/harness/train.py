"""Train one workload with nano, official DeepSpeed or FSDP2; rank 0 prints the log contract.

The impls differ only in which module provides `init_distributed` and `initialize` (the official
config is derived from the same nano config; FSDP2's engine maps it: zero_lab/fsdp2/config_map.py,
docs/fsdp2.md). Lines and fields: docs/log-format.md.

Commands (from the repository root; on CPU each process is one rank):

    # tiny model, 2 ranks on CPU, ZeRO-2, fp32, 5 optimizer steps: nano, then official
    .venv/bin/torchrun --standalone --nproc_per_node=2 harness/train.py --impl nano \
        --model-name tiny --zero-stage 2 --steps 5 --batch-size 4 --seq-len 64
    .venv/bin/torchrun --standalone --nproc_per_node=2 harness/train.py --impl official \
        --model-name tiny --zero-stage 2 --steps 5 --batch-size 4 --seq-len 64
    .venv/bin/torchrun --standalone --nproc_per_node=2 harness/train.py --impl fsdp2 \
        --model-name tiny --zero-stage 2 --steps 5 --batch-size 4 --seq-len 64

    # checkpoints: save at steps 2 and 4, then resume from step 4 and train to step 8
    .venv/bin/torchrun --standalone --nproc_per_node=2 harness/train.py --impl nano \
        --model-name tiny --steps 4 --save-dir runs/ckpt --save-every 2
    .venv/bin/torchrun --standalone --nproc_per_node=2 harness/train.py --impl nano \
        --model-name tiny --steps 8 --save-dir runs/ckpt --resume

    # one process, no torchrun (or, from an installed zero-lab: python -m zero_lab.harness ...)
    .venv/bin/python harness/train.py --impl nano --model-name tiny --steps 5

    # the seed's comparison on one GPU: Qwen3-0.6B architecture, bf16, stage 2
    torchrun --standalone --nproc_per_node=1 harness/train.py --impl nano \
        --model-name qwen3-0.6b --model-dtype bfloat16 --zero-stage 2 --steps 20 \
        --batch-size 1 --seq-len 512

Bad input (unknown preset, missing model directory, malformed dataset, more processes than GPUs,
a config stage contradicting --zero-stage, fp16 with official DeepSpeed on CPU) prints
`error: <problem>. <fix>` on stderr and exits 2 before any engine starts; so do the problems only
the engine or Hugging Face find (a config value nano rejects, an --attn-impl that is not
installed, a model directory that does not load). An allocation the device refuses prints one
`out of memory: rank R in <phase>: ...` line and exits 4 (zero_lab/workload/faults/out_of_memory.py).
With ZERO_LAB_COLLECTIVE_RECORD naming a directory (the launcher names the run's logs/), each rank
keeps its flight record of collectives there (zero_lab/workload/meters/collective_record.py); with
ZERO_LAB_PARAMETER_NORMS naming a file, rank 0 writes each parameter's norm after every step there
(zero_lab/workload/meters/parameter_norms.py), which names the parameters where two runs part first.
"""

from __future__ import annotations

import datetime
import os
import sys
import time

import torch
import torch.distributed as dist

from zero_lab.nano.config import load_config, without_official_only_keys
from zero_lab.nano.errors import NanoConfigError
from zero_lab.workload.meters import collective_record
from zero_lab.workload.meters.comm_meter import CommMeter
from zero_lab.workload.data import make_batches
from zero_lab.workload.errors import WorkloadError
from zero_lab.workload.log_contract.contract_lines import announce_rank, emit, model_header, opt_step_fields, zero_header
from zero_lab.workload.engines.impls import default_single_process_env, engine_config, load_engine_module
from zero_lab.workload import state_formula
from zero_lab.workload.engines import own_engine
from zero_lab.workload.engines.own_engine import split_impl
from zero_lab.workload.meters.memory_meter import MemoryMeter
from zero_lab.workload.nodes import resolve_ranks_per_node
from zero_lab.nano.collectives import RANKS_PER_NODE_ENVIRONMENT
from zero_lab.workload.models import build_model, load_tokenizer, parameter_groups
from zero_lab.workload.faults.out_of_memory import (EXIT_OUT_OF_MEMORY, OutOfMemory, allocator_figures, is_out_of_memory,
                                                    out_of_memory_line)
from zero_lab.workload.step_phase import Phase, StepPhase
from zero_lab.nano.dtypes import DTYPE_NAME_OF_PRECISION
from zero_lab.workload.run_config import build_parser, check_launch, passed_to_official, precision_of
from zero_lab.workload.meters.step_metrics import StepMetrics, comm_totals, step_warnings
from zero_lab.workload.faults import rank_pause
from zero_lab.workload.faults import restart_hooks as restarts
from zero_lab.workload.tracing.timeline import start_tracing
from zero_lab.workload.meters import parameter_norms
from zero_lab.workload.tracing.trace_settings import TraceRequest


def checkpoint_fields(action: str, step: int, save_dir: str, tag: str, seconds: float) -> dict:
    """The `[ckpt]` line: the step, the tag, the bytes of all its files (every rank's), the seconds."""
    directory = os.path.join(save_dir, tag)
    files = [os.path.join(directory, name) for name in os.listdir(directory)] if os.path.isdir(directory) else []
    return {"action": action, "step": step, "tag": tag, "bytes": sum(os.path.getsize(path) for path in files if os.path.isfile(path)),
            "files": len(files), "seconds": seconds}


def resume(engine, args, rank: int, comm: CommMeter) -> int:
    """--resume: load the checkpoint (every rank), say so, and return the step it was saved at."""
    started = time.perf_counter()
    with comm.paused():
        path, _ = engine.load_checkpoint(args.save_dir, tag=None if args.resume == "latest" else args.resume)
    if path is None:
        raise WorkloadError(f"--resume found no checkpoint in {args.save_dir} (no `latest` file)",
                            "Save one first with --save-dir, or pass a TAG")
    tag = os.path.basename(os.path.dirname(path))
    emit(rank, "ckpt", checkpoint_fields("load", engine.global_steps, args.save_dir, tag,
                                         time.perf_counter() - started))
    return engine.global_steps


def save(engine, args, rank: int, comm: CommMeter, step: int) -> None:
    """--save-dir: every rank saves (DeepSpeed's default tag global_step<N>), then `latest` moves once
    all have (`restarts.commit_latest`); rank 0 says so."""
    started = time.perf_counter()
    tag = f"global_step{engine.global_steps}"
    with comm.paused():
        engine.save_checkpoint(args.save_dir, tag=tag, save_latest=False)
        rank_pause.reached(rank, "save", step)
        restarts.commit_latest(args.save_dir, tag, rank, dist.barrier)
    emit(rank, "ckpt", checkpoint_fields("save", step, args.save_dir, tag, time.perf_counter() - started))


def model_state_formula(impl: str, model: torch.nn.Module, settings, world_size: int,
                        device: torch.device) -> dict | None:
    """The impl's own model-state formula for this workload: nano's (official follows it) or FSDP2's."""
    if impl == "fsdp2":
        from zero_lab.fsdp2.memory_formula import peak_bytes

        return peak_bytes(model, settings, world_size, device.type)
    return state_formula.peak_bytes(model, settings, world_size)


def dist_backend(device: torch.device) -> str:
    """The process group's backend for the run's device: gloo for CPU tensors, nccl for CUDA."""
    return "gloo" if device.type == "cpu" else "nccl"


def prepare(argv: list[str] | None):
    """Every check that needs no engine: flags, config, model name, dataset (Phase 1)."""
    args = build_parser().parse_args(argv)
    args.resume = restarts.resume_tag(args.save_dir, args.resume)  # a restarted attempt: from `latest`
    args.impl, args.engine_path = split_impl(args.impl)  # NAME=PATH: an engine of the user's own
    default_single_process_env()
    world_size = int(os.environ["WORLD_SIZE"])
    local_world_size = int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    device, config = check_launch(args, world_size, local_world_size)
    if args.ranks_per_node:  # nano's qgZ groups its all-to-alls by it (`nano.zeropp.quantized_gradients`)
        os.environ[RANKS_PER_NODE_ENVIRONMENT] = str(args.ranks_per_node)
    args.ranks_per_node = resolve_ranks_per_node(args.ranks_per_node, local_world_size, world_size)
    args.model_dtype = args.model_dtype or DTYPE_NAME_OF_PRECISION[precision_of(config)]
    tokenizer = load_tokenizer(args.model_name, args.trust_remote_code)
    batches = make_batches(tokenizer, args.seq_len, config["train_micro_batch_size_per_gpu"],
                           world_size, args.seed, args.dataset_path, args.max_samples,
                           args.min_target_tokens)
    return args, device, config, batches


def select_device(device: torch.device) -> None:
    """Make `device` this process's CUDA device and initialise CUDA (nothing on CPU). It comes
    before any meter: CUDA's allocator statistics refuse a device CUDA has not initialised."""
    if device.type == "cuda":
        torch.cuda.set_device(device)
        torch.cuda.init()


def train(args, device: torch.device, config: dict, batches) -> None:
    """Phases 2-5: meters, engine, training steps, totals; the meters come out whatever happens,
    and a refused allocation becomes OutOfMemory, one line naming the rank, the phase and the figures."""
    # Phase 2: the device first, then both meters before the engine exists (see their modules for why),
    # and the flight record of collectives when the launcher asked for one.
    select_device(device)
    comm = CommMeter(getattr(args, "ranks_per_node", None)).install()  # resolved by `prepare`
    memory = MemoryMeter(device)
    memory.start()
    phase = StepPhase()
    record = collective_record.from_environment()
    if record is not None:
        comm.record_to(record, phase)
    tracing = start_tracing(TraceRequest.from_environment(), comm, memory, phase, device, int(os.environ.get("RANK", 0)))
    try:
        train_with_meters(args, device, config, batches, comm, memory, phase)
    except Exception as error:
        if not is_out_of_memory(error):
            raise
        rank = dist.get_rank() if dist.is_initialized() else int(os.environ.get("RANK", 0))
        figures = allocator_figures(device, memory)
        raise OutOfMemory(out_of_memory_line(rank, phase.current, str(error), figures)) from None
    finally:
        if tracing is not None:  # --trace: this rank's timeline and memory snapshot
            tracing.close()
        memory.stop()
        comm.uninstall()
        if record is not None:
            record.close()


def train_with_meters(args, device: torch.device, config: dict, batches, comm: CommMeter,
                      memory: MemoryMeter, phase: StepPhase) -> None:
    """Phases 3-5, measured by the meters Phase 2 installed; phase follows where the step is."""
    engine_module = (load_engine_module(args.impl, device) if args.engine_path is None
                     else own_engine.load_module(args.engine_path))
    # Named, not left to the engine: nano (like DeepSpeed) defaults to nccl whenever CUDA exists,
    # which breaks `--device cpu` on a GPU host.
    restarts.join_attempt_group(dist_backend(device), datetime.timedelta(seconds=args.dist_timeout))
    own_engine.init_distributed(engine_module, dist_backend=dist_backend(device),
                                timeout=datetime.timedelta(seconds=args.dist_timeout))
    rank, world_size = dist.get_rank(), dist.get_world_size()
    # Every rank says who it is (the only line ranks other than 0 print): on a node without
    # global rank 0, the CLI learns the world size and where the [opt_step] lines are.
    announce_rank(rank, world_size)

    # Phase 3: the same weights on every rank and for both impls, then the engine.
    model = build_model(args.model_name, args.seed, args.model_dtype, args.attn_impl,
                        args.gradient_checkpointing, args.trust_remote_code).to(device)
    weight_decay = config.get("optimizer", {}).get("params", {}).get("weight_decay", 0.0)
    # The config with DeepSpeed's defaults, as nano reads it (less what only official knows).
    settings = load_config(without_official_only_keys(config), world_size=world_size)
    formula = model_state_formula(args.impl, model, settings, world_size, device)
    impl_config, notes = engine_config(args.impl, config, device)
    engine, _, _, _ = engine_module.initialize(
        model=model, model_parameters=parameter_groups(model, weight_decay), config=impl_config)
    if args.engine_path is not None:  # only DeepSpeed's core calls are asked of it; the rest is optional
        engine = own_engine.OwnEngine(engine, impl_config)
    emit(rank, "zero", zero_header(args.impl, engine.zero_optimization_stage(), world_size, settings,
                                   engine.gradient_accumulation_steps()))
    emit(rank, "model", model_header(args.model_name, engine, settings.precision, device, args.seq_len,
                                     config["train_micro_batch_size_per_gpu"], args.gradient_checkpointing, formula,
                                     memory.peak_bytes(), memory.resident_beside_tensors()))

    for message in getattr(engine, "warnings", []):  # nano's start-up notes (official logs its own)
        emit(rank, "warn", {"kind": "engine", "message": message})
    for message in notes:
        emit(rank, "warn", {"kind": "optimizer", "message": message})
    passed = passed_to_official(args.impl, config)
    if passed:
        emit(rank, "warn", {"kind": "config", "message": passed})

    # Phase 4: the steps (after --resume's, from the checkpoint's). Initialization's broadcasts
    # and checkpoints' collectives are not part of any step.
    first = resume(engine, args, rank, comm) + 1 if args.resume is not None else 1
    comm.reset()
    memory.freeze_survivors()  # each sample's garbage collection then walks only what the steps create
    metrics = StepMetrics(memory, comm, device, world_size)
    norms = parameter_norms.from_environment(rank)
    if norms is not None:  # the parameters before the first update: whether it moved them shows
        norms.after_step(first - 1, engine.module)
    # nano names the buffers it holds; official DeepSpeed's `memory_breakdown` is a config flag.
    breakdown = getattr(engine, "memory_breakdown", None) if args.impl == "nano" or args.engine_path else None
    accumulation = engine.gradient_accumulation_steps()
    for step in range(first, args.steps + 1):
        metrics.begin()
        skipped_before = engine.skipped_steps
        for micro in range(accumulation):
            last = micro == accumulation - 1  # memory through the step: the last micro-step's phases
            batch = batches.get((step - 1) * accumulation + micro, rank, device)
            phase.enter(Phase.FORWARD, step)
            loss = engine(**batch).loss
            if last:
                metrics.sample_phase("after_forward", breakdown)
            phase.enter(Phase.BACKWARD)
            engine.backward(loss)
            if last:
                metrics.sample_phase("after_backward", breakdown)
            phase.enter(Phase.STEP)
            update_lr = engine.get_lr()[0]  # the learning rate this step's update uses
            engine.step()
            if last:
                metrics.sample_phase("after_step", breakdown)
            metrics.add_loss(loss)
        phase.enter(Phase.BETWEEN_STEPS)
        tokens = batch["input_ids"].numel() * accumulation * world_size
        applied = engine.skipped_steps == skipped_before
        fields = opt_step_fields(engine, metrics.end(tokens), breakdown, update_lr, applied)
        fields["attempt"] = rank_pause.restart_attempt()
        emit(rank, "opt_step", fields, step)
        for sample in metrics.phases:
            emit(rank, "phase", sample.fields(step))
        for warning in step_warnings(step, fields["loss"], fields["loss_scale"], skipped=not applied):
            emit(rank, "warn", warning)
        if norms is not None:  # rank 0: each parameter's norm, for naming where two runs part first
            norms.after_step(step, engine.module)
        if args.save_dir and (step == args.steps or (args.save_every and step % args.save_every == 0)):
            save(engine, args, rank, comm, step)
        rank_pause.reached(rank, "step", step)

    # Phase 5: totals per collective type over the training steps; no rank tears its process
    # group down while another still works.
    for fields in comm_totals(comm.snapshot(), max(1, args.steps - first + 1)):
        emit(rank, "comm", fields)
    with comm.paused():
        dist.barrier()


def main(argv: list[str] | None = None) -> int:
    """0 after training; 2 with one `error:` line on this rank's stderr for bad input, found before
    or inside `train` (nano rejecting a config value, Hugging Face rejecting the model or --attn-impl);
    4 (EXIT_OUT_OF_MEMORY) with one `out of memory:` line when an allocation was refused."""
    try:
        train(*prepare(argv))
    except (WorkloadError, NanoConfigError) as error:
        if not isinstance(error, WorkloadError):
            error = WorkloadError.from_nano(error)
        # Every rank says why: the first to exit ends the job, and it need not be rank 0.
        print(f"error: {error}", file=sys.stderr)
        return 2
    except OutOfMemory as error:  # every rank that ran out says so, in one line
        print(error, file=sys.stderr)
        return EXIT_OUT_OF_MEMORY
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    return 0


def run_as_script() -> None:
    """Run `main` and leave without interpreter finalization: gloo's worker threads can still hold
    work objects whose tensors need the GIL to be freed, and freeing them while the interpreter is
    torn down aborts the process (SIGABRT, "terminate called without an active exception") after
    a run that finished cleanly. The process group is already destroyed and the output flushed."""
    exit_code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(exit_code)


if __name__ == "__main__":
    run_as_script()
