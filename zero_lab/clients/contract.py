"""The log contract of a user's script (docs/log-format.md), written by the engine it imported.

Phase 1 (`start_meters`, when torch is imported): the communication meter wraps torch.distributed's
         collectives before any `init_distributed`, writing each to the rank's flight record when
         the launcher asked for one (`collective_record`); on CPU the memory meter starts tracking
         tensor storage before the script builds its model (as the built-in workload does before its own).
Phase 2 (`wrap_initialize`, when deepspeed is imported): `deepspeed.initialize` is wrapped. After
         the real one returns, every rank prints `[rank]`, rank 0 `[zero]` (the settings, read
         from the config the script passed, as nano reads it), and the engine's forward, backward
         and step are hooked (`step_hook.StepHook`): `[model]` at the first training forward, then
         `[opt_step k]` and `[phase]` at every optimizer step.
Phase 3 (at exit): rank 0 prints `[comm]`, the collectives of the training steps per type.
The same code serves nano's drop-in and official DeepSpeed: the meters watch from outside.
"""

from __future__ import annotations

import atexit
import functools
import inspect
import os
from typing import Any

import torch
import torch.distributed as dist

from zero_lab.clients.step_hook import StepHook
from zero_lab.nano.config import load_config, read_config_source, without_official_only_keys
from zero_lab.nano.errors import NanoConfigError
from zero_lab.workload import state_formula
from zero_lab.workload.meters import collective_record
from zero_lab.workload.meters.comm_meter import CommMeter
from zero_lab.workload.log_contract.contract_lines import announce_rank, emit, zero_header
from zero_lab.workload.meters.memory_meter import MemoryMeter
from zero_lab.workload.step_phase import StepPhase
from zero_lab.workload.tracing.timeline import start_tracing
from zero_lab.workload.tracing.trace_settings import TraceRequest

_comm: CommMeter | None = None
_memory: MemoryMeter | None = None


def start_meters(device_type: str) -> None:
    """Phase 1: the communication meter, and on CPU the memory meter, from now on."""
    global _comm, _memory
    _comm = CommMeter().install()
    record = collective_record.from_environment()
    if record is not None:
        _comm.record_to(record, StepPhase())  # the step hook moves the phase along
    if device_type == "cpu":
        _memory = MemoryMeter(torch.device("cpu"))
        _memory.start()


def config_given(original, args: tuple, kwargs: dict) -> Any:
    """The config the script handed `initialize`: `config`, `config_params` or `args.deepspeed_config`."""
    bound = inspect.signature(original).bind_partial(*args, **kwargs).arguments
    given = bound.get("config") or bound.get("config_params")
    if given is None and bound.get("args") is not None:
        given = getattr(bound["args"], "deepspeed_config", None)
    return given


def settings_of(config: Any, world_size: int):
    """The config as nano reads it, with DeepSpeed's defaults filled in, for the `[zero]` line and
    the state formula; keys nano knows official has but does not implement are left out (an
    official run may use them), and so is `steps_per_print`, which accelerate sets to infinity and
    no field reads. None when it still cannot be read (`[zero]` then has the engine's figures only)."""
    try:
        raw = without_official_only_keys(read_config_source(config))
        raw.pop("steps_per_print", None)
        return load_config(raw, world_size=world_size)
    except (NanoConfigError, OSError, ValueError, TypeError):
        return None


def state_formula_of(model: torch.nn.Module | None, settings, world_size: int) -> dict | None:
    """nano's model-state bytes per place for this model (None: no settings, no model, or a model
    whose parameters `zero.Init` has already partitioned, whose sizes it cannot read from them)."""
    if settings is None or not isinstance(model, torch.nn.Module):
        return None
    if any(hasattr(parameter, "ds_numel") for parameter in model.parameters()):
        return None
    return state_formula.peak_bytes(model, settings, world_size)


def wrap_initialize(deepspeed, impl: str) -> None:
    """Phase 2: `deepspeed.initialize` hooks the engine it returns."""
    original = deepspeed.initialize

    @functools.wraps(original)
    def initialize(*args, **kwargs):
        world_size = dist.get_world_size() if dist.is_initialized() else int(os.environ.get("WORLD_SIZE", 1))
        settings = settings_of(config_given(original, args, kwargs), world_size)
        model = inspect.signature(original).bind_partial(*args, **kwargs).arguments.get("model")
        formula = state_formula_of(model, settings, world_size)
        returned = original(*args, **kwargs)
        engine = returned[0]
        rank, world_size = dist.get_rank(), dist.get_world_size()
        announce_rank(rank, world_size)
        emit(rank, "zero", zero_header(impl, engine.zero_optimization_stage(), world_size, settings,
                                       engine.gradient_accumulation_steps()))
        for message in getattr(engine, "warnings", []):  # nano's start-up notes (official logs its own)
            emit(rank, "warn", {"kind": "engine", "message": message})
        meter = memory_meter(engine)
        hook = StepHook(engine, impl, _comm or CommMeter(), meter, rank, world_size, formula)
        hook.install()
        meter.freeze_survivors()  # each step's garbage collection then walks only what training creates
        atexit.register(hook.print_comm_totals)  # Phase 3
        start_script_tracing(hook, meter, rank)
        return returned

    deepspeed.initialize = initialize


def memory_meter(engine) -> MemoryMeter:
    """The CPU meter Phase 1 started; on CUDA one started now, on the engine's device."""
    global _memory
    if _memory is None:
        _memory = MemoryMeter(next(engine.module.parameters()).device)
        _memory.start()
    return _memory


def start_script_tracing(hook: StepHook, meter: MemoryMeter, rank: int) -> None:
    """--trace on a script: the timeline follows the step hook's phase; its files are written at exit."""
    tracing = start_tracing(TraceRequest.from_environment(), hook.comm, meter, hook.phase, meter.device, rank)
    if tracing is not None:
        atexit.register(tracing.close)  # before Phase 3's totals (atexit runs in reverse)
