"""`initialize` and `add_config_arguments`: DeepSpeed's entry points, building a NanoEngine.

`initialize` runs in phases:
    Phase 1: refuse what nano does not do (model parallelism).
    Phase 2: join the process group if needed, then load and check the config for its world size;
             a client's own optimizer is checked (`client_optimizers.py`: torch's Adam or AdamW).
    Phase 3: move the module to its device, and its parameters (not its buffers: RoPE's inv_freq
             stays fp32) to fp16/bf16 when the config asks, as official DeepSpeed casts them.
    Phase 4: collect trainable parameter groups: the client optimizer's own, else from
             `model_parameters` (params or dicts); a parameter no group holds (frozen) that
             `zero.Init` partitioned is made whole, for good.
    Phase 5: decide the policies (which parameters share a flat buffer: `units`; where tensors
             live: `placement`, `offload/`; where a `zero.Init` parameter's values come from:
             `init/`), build the stage's ZeRO optimizer (flattening the parameters), the LR
             schedule and, with `training_data`, a distributed data loader. With the config's
             optimizer Muon, Phases 4 and 5 each call `muon/` once: tag and split the groups,
             then put Muon in Adam's place.
"""

from __future__ import annotations

import argparse
import logging
from typing import Any, Callable, Optional

import torch
import torch.distributed

from zero_lab.nano.facade.client_optimizers import adopt_groups, client_optimizer
from zero_lab.nano.collectives import Collectives
from zero_lab.nano.config import NanoConfig, load_config, read_config_source
from zero_lab.nano.facade.distributed import init_distributed
from zero_lab.nano.facade.engine import NanoEngine
from zero_lab.nano.errors import NanoConfigError
from zero_lab.nano.policies.fetch_policy import FetchRules
from zero_lab.nano.flat_buffer import WholeParameters
from zero_lab.nano.init import partitions as init_partitions
from zero_lab.nano import muon
from zero_lab.nano.facade.lr_schedules import build_scheduler
from zero_lab.nano.dtypes import torch_dtype
from zero_lab.nano.offload.placement import OffloadPlacement, host_threads
from zero_lab.nano.placement import Placement
from zero_lab.nano.stage0 import Stage0Optimizer
from zero_lab.nano.stage1 import Stage1Optimizer
from zero_lab.nano.stage1_fp32_accumulation import Stage1Fp32AccumulationOptimizer
from zero_lab.nano.stage2 import Stage2Optimizer
from zero_lab.nano.stage3 import Stage3Optimizer
from zero_lab.nano.zeropp.hierarchical_partition import Stage3HierarchicalOptimizer
from zero_lab.nano.zeropp.quantized_weights import Stage3HierarchicalQuantizedWeightsOptimizer, Stage3QuantizedWeightsOptimizer
from zero_lab.nano.zeropp import quantized_gradients
from zero_lab.nano.policies.stage3_units import choose_units

logger = logging.getLogger(__name__)

STAGE_OPTIMIZERS = {(optimizer.stage, optimizer.variant): optimizer  # one per row of the stage table
                    for optimizer in (Stage0Optimizer, Stage1Optimizer, Stage1Fp32AccumulationOptimizer,
                                      Stage2Optimizer, Stage3Optimizer)}

# Stage 3 with ZeRO++: (hpZ, qwZ, qgZ) on -> the optimizer class (all off: the stage table's).
ZERO_PLUS_PLUS_OPTIMIZERS = {
    (True, False, False): Stage3HierarchicalOptimizer,
    (False, True, False): Stage3QuantizedWeightsOptimizer,
    (True, True, False): Stage3HierarchicalQuantizedWeightsOptimizer,
    (False, False, True): quantized_gradients.Stage3QuantizedGradientsOptimizer,
    (True, False, True): quantized_gradients.Stage3HierarchicalQuantizedGradientsOptimizer,
    (False, True, True): quantized_gradients.Stage3QuantizedWeightsAndGradientsOptimizer,
    (True, True, True): quantized_gradients.Stage3ZeroPlusPlusOptimizer}


def stage_optimizer(config: NanoConfig, world_size: int) -> type:
    """Phase 5's optimizer class: the stage's, or at stage 3 ZeRO++'s for the keys that are on
    (hpZ only over more than one rank)."""
    zero = config.zero_optimization
    ideas = (zero.hpz_enabled and world_size > 1, zero.zero_quantized_weights, zero.zero_quantized_gradients)
    if any(ideas):
        return ZERO_PLUS_PLUS_OPTIMIZERS[ideas]
    row = config.stage_facts  # the stage, or its variant (stages.for_run)
    return STAGE_OPTIMIZERS[(row.number, row.variant)]


def _parameter_groups(model: torch.nn.Module, model_parameters: Any) -> list[dict]:
    """Phase 4: DeepSpeed accepts an iterable of parameters or of dicts with a "params" entry."""
    entries = list(model.parameters() if model_parameters is None else model_parameters)
    if entries and isinstance(entries[0], dict):
        groups = [{**entry, "params": list(entry["params"])} for entry in entries]
    else:
        groups = [{"params": entries}]
    for group in groups:
        group["params"] = [parameter for parameter in group["params"] if parameter.requires_grad]
    return [group for group in groups if group["params"]]


def _placement(config: NanoConfig, device: torch.device) -> Placement:
    """Phase 5's placement policy, from the offload sections: everything on the device, unless a
    section offloads (`offload/placement.py`)."""
    zero = config.zero_optimization
    if not (zero.offload_optimizer.enabled or zero.offload_param.enabled):
        return Placement(device)
    return OffloadPlacement(device, offload_optimizer=zero.offload_optimizer.enabled,
                            offload_parameters=zero.offload_param.enabled,
                            pin_memory=(zero.offload_optimizer.enabled and zero.offload_optimizer.pin_memory)
                            or (zero.offload_param.enabled and zero.offload_param.pin_memory))


def _policies(config: NanoConfig, collectives: Collectives, trainable: set) -> dict:
    """Phase 5's policies a stage's optimizer takes besides units and placement: where the flat
    buffers read parameters from (gathered from `zero.Init`'s slices if the model was built so), and
    at stage 3 official DeepSpeed's fetch rules (`fetch_policy`)."""
    built_under_init = any(init_partitions.is_partitioned(parameter) for parameter in trainable)
    policies = {"parameter_source": init_partitions.InitPartitions(collectives) if built_under_init else WholeParameters}
    zero = config.zero_optimization
    if config.stage_facts.partitions_parameters:
        policies["fetch_rules"] = FetchRules(zero.stage3_prefetch_bucket_size, zero.stage3_max_live_parameters,
                                             zero.stage3_max_reuse_distance)
    return policies


def _scheduler(config: NanoConfig, lr_scheduler: Any, optimizer: torch.optim.Optimizer) -> Any:
    if config.scheduler is not None:
        if lr_scheduler is not None:
            raise NanoConfigError("an LR scheduler was given both in the config and as lr_scheduler=; keep one")
        return build_scheduler(config.scheduler.type, config.scheduler.params, optimizer)
    if callable(lr_scheduler) and not hasattr(lr_scheduler, "step"):
        return lr_scheduler(optimizer)
    return lr_scheduler


def _dataloader(training_data: Any, config: NanoConfig, collate_fn: Optional[Callable]) -> Any:
    if training_data is None:
        return None
    sampler = None
    if torch.distributed.is_initialized():
        sampler = torch.utils.data.distributed.DistributedSampler(training_data)
    return torch.utils.data.DataLoader(training_data, batch_size=config.train_micro_batch_size_per_gpu,
                                       sampler=sampler, collate_fn=collate_fn)


def initialize(args: Any = None, model: Optional[torch.nn.Module] = None, optimizer: Any = None,
               model_parameters: Any = None, training_data: Any = None, lr_scheduler: Any = None,
               distributed_port: int = 29500, mpu: Any = None, dist_init_required: Optional[bool] = None,
               collate_fn: Optional[Callable] = None, config: Any = None, mesh_param: Any = None,
               config_params: Any = None) -> tuple[NanoEngine, Any, Any, Any]:
    """Return (engine, optimizer, training_dataloader, lr_scheduler), as deepspeed.initialize does."""
    # Phase 1
    if model is None:
        raise NanoConfigError("initialize() needs model=; pass the torch.nn.Module to train")
    if mpu is not None or mesh_param is not None:
        raise NanoConfigError("nano does not support model parallelism (mpu/mesh_param); remove them")
    # Phase 2
    if dist_init_required is not False:
        init_distributed(distributed_port=distributed_port)
    collectives = Collectives()
    hidden_size = getattr(getattr(model, "config", None), "hidden_size", None)
    raw_config = read_config_source(config if config is not None else config_params, args)
    nano_config = load_config(raw_config, world_size=collectives.world_size, hidden_size=hidden_size)
    if optimizer is not None:
        optimizer = client_optimizer(optimizer, model_parameters, nano_config)
    elif nano_config.optimizer is None:
        raise NanoConfigError('config has no "optimizer" section and no optimizer= was given; add {"optimizer": '
                              '{"type": "AdamW", "params": {"lr": 1e-4}}} or pass a torch.optim.AdamW')
    # Phase 3
    device = collectives.device  # where the collectives communicate: forward and backward run there too
    model.to(device)
    if nano_config.precision != "fp32":
        dtype = torch_dtype(nano_config.precision)
        for parameter in model.parameters():
            if parameter.is_floating_point() and parameter.dtype != dtype:
                parameter.data = parameter.data.to(dtype)
    # Phase 4
    groups = adopt_groups(optimizer) if optimizer is not None else _parameter_groups(model, model_parameters)
    uses_muon = nano_config.optimizer is not None and nano_config.optimizer.type == "Muon"
    if uses_muon:  # official's tagging rule and its two halves (`muon/`)
        muon.check(nano_config, optimizer)
        muon.tag_parameters(model)
        groups = muon.split_groups(groups, nano_config.optimizer.params)
    names = {parameter: name for name, parameter in model.named_parameters()}
    owned = {parameter for group in groups for parameter in group["params"]}
    for parameter in names:
        if parameter not in owned and init_partitions.is_partitioned(parameter):
            parameter.data = init_partitions.whole_values(parameter, collectives).to(parameter.data)  # Phase 3's dtype
    adopted = [names.get(p, "?") for group in groups for p in group["params"] if getattr(p, "zero_lab_flat_buffer", False)]
    if adopted:
        raise NanoConfigError(f"parameter {adopted[0]} already belongs to another nano engine; build a fresh model "
                              "(or a deep copy) for each initialize()")
    # Phase 5
    units = choose_units(model, [parameter for group in groups for parameter in group["params"]],
                         nano_config.zero_optimization)
    zero_optimizer = stage_optimizer(nano_config, collectives.world_size)(
        model, units, groups, nano_config, collectives, _placement(nano_config, device), names,
        **_policies(nano_config, collectives, owned))
    if uses_muon:
        muon.install(zero_optimizer, nano_config)
    scheduler = _scheduler(nano_config, lr_scheduler, zero_optimizer.partition_optimizer)
    dataloader = _dataloader(training_data, nano_config, collate_fn)
    engine = NanoEngine(model, nano_config, zero_optimizer, scheduler, collectives, device, dataloader, raw_config)
    placement = zero_optimizer.placement
    offloaded = isinstance(placement, OffloadPlacement)
    if offloaded and placement.offload_optimizer and device.type != "cpu":  # on CPU the launcher already shares the cores
        torch.set_num_threads(host_threads())
    if offloaded and placement.pin_memory and not placement.pins:
        engine.warnings.append("pin_memory is true but this run's device is not CUDA, so nothing is pinned: "
                               "host copies are synchronous")
        logger.warning(engine.warnings[-1])
    return engine, zero_optimizer, dataloader, scheduler


def add_config_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add DeepSpeed's --deepspeed and --deepspeed_config flags to a user's parser."""
    group = parser.add_argument_group("DeepSpeed", "DeepSpeed configurations")
    group.add_argument("--deepspeed", default=False, action="store_true",
                       help="Enable DeepSpeed (helper flag for user code, no impact on the engine)")
    group.add_argument("--deepspeed_config", default=None, type=str, help="DeepSpeed json configuration file.")
    return parser
