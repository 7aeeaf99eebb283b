"""The lab engine: DeepSpeed's API over one flat buffer per parameter group. Given: the lab is lab.py.

`zero-lab lab start` copied this package; `zero-lab lab check` runs it as an impl beside nano and
official DeepSpeed. It works at stage 0 (plain data parallelism) as it is. At the lab's stage it
calls the functions of lab.py, which you write (labs zero3, fp16 and offload: on_nano.py runs
nano's own engine with your lab.py's functions in place of nano's).

Vocabulary (the same words as nano's, zero_lab/nano/__init__.py):
    flat buffer          one parameter group's parameters, end to end, in one fp32 tensor padded to
                         a multiple of the world size; each parameter is a view into it
    partition            this rank's slice of the flat buffer: [partition_start, partition_end)
    gradient bucket      a flat buffer's gradients, gathered as backward produces them (stage 2)
    gradient partition   this rank's slice of the gradients, summed over ranks and averaged
    optimizer states     Adam's exp_avg and exp_avg_sq, as large as what this rank updates

One optimizer step, at every stage:
    Phase 1 `engine(**batch)`: the module's forward.
    Phase 2 `engine.backward(loss)`: autograd; stage 2 reduces each bucket as it fills (lab.gradient_ready).
    Phase 3 `engine.step()`: gradient partitions (stage 0: all-reduce; stage 1: lab.reduce_scatter_gradients),
            global gradient norm and clipping, Adam on this rank's partition, then every rank's
            partition back into every rank's flat buffer (lab.all_gather_parameters).
"""

from __future__ import annotations

import datetime
import math

import torch
import torch.distributed as dist

from zero_lab.nano.adamw import PartitionedAdam
from zero_lab.nano.collectives import Collectives, free_storage, labelled
from zero_lab.nano.layout import FlatLayout
from zero_lab.nano.facade.lr_schedules import build_scheduler

from . import lab

CATEGORIES = ("parameters", "gathered_parameters", "gradients", "fp32_master_partition", "optimizer_states",
              "gradient_partition", "communication_buckets")


def init_distributed(dist_backend: str = "gloo", timeout: datetime.timedelta | None = None, **_) -> None:
    if not dist.is_initialized():
        dist.init_process_group(backend=dist_backend, timeout=timeout or datetime.timedelta(minutes=30))


def tensor_bytes(tensor: torch.Tensor | None) -> int:
    return 0 if tensor is None else tensor.numel() * tensor.element_size()


class FlatGroup:
    """One parameter group as a flat buffer: the parameters become views of `flat`."""

    def __init__(self, parameters: list[torch.nn.Parameter], stage: int, comm: Collectives):
        self.parameters = parameters
        layout = FlatLayout.for_stage(tuple(p.numel() for p in parameters), stage, "fp32", comm.world_size)
        self.numel, self.padded_numel = layout.numel, layout.padded_numel
        self.offsets = dict(zip(parameters, layout.offsets))  # where each parameter starts in the flat buffer
        self.flat = torch.zeros(self.padded_numel, dtype=torch.float32, device=parameters[0].device)
        for parameter, offset in self.offsets.items():
            self.flat[offset:offset + parameter.numel()].copy_(parameter.data.reshape(-1))
            parameter.data = self.flat[offset:offset + parameter.numel()].view_as(parameter)
        comm.broadcast(self.flat)  # the same weights on every rank
        if stage == 0:
            self.partition_start, self.partition_end = 0, self.padded_numel
        else:
            self.partition_start, self.partition_end = lab.partition_bounds(self.padded_numel, comm.world_size,
                                                                            comm.rank)
        self.grad_partition: torch.Tensor | None = None  # Phase 3's input
        self.bucket: torch.Tensor | None = None  # stage 2: the gradient bucket while it fills
        self.arrived = 0  # stage 2: parameters whose gradient has landed in the bucket this step

    @property
    def partition(self) -> torch.Tensor:
        return self.flat[self.partition_start:self.partition_end]

    def gradient_buffer(self) -> torch.Tensor:
        """Every parameter's .grad, end to end and padded (a new tensor); releases the .grad tensors."""
        flat = torch.zeros_like(self.flat)
        for parameter, offset in self.offsets.items():
            if parameter.grad is not None:
                flat[offset:offset + parameter.numel()].copy_(parameter.grad.reshape(-1))
                parameter.grad = None
        return flat


class LabEngine:
    """What `initialize` returns first: DeepSpeed's engine calls over the lab's ZeRO stage."""

    def __init__(self, model: torch.nn.Module, model_parameters, config: dict):
        self.module = model
        self.config = config
        self.stage = int(config.get("zero_optimization", {}).get("stage", 0))
        if self.stage not in (0, lab.STAGE):
            raise ValueError(f"this lab engine runs stage 0 or stage {lab.STAGE} (lab {lab.LAB}), not {self.stage}")
        if config.get("gradient_accumulation_steps", 1) != 1 or config.get("fp16", {}).get("enabled"):
            raise ValueError("this lab engine runs gradient_accumulation_steps 1 in fp32")
        self.comm = Collectives()
        given = list(model_parameters)
        groups = [dict(group) for group in given] if given and isinstance(given[0], dict) else [{"params": given}]
        groups = [group for group in groups if list(group["params"])]
        self.groups = [FlatGroup(list(group["params"]), self.stage, self.comm) for group in groups]
        params = config["optimizer"]["params"]
        for group in groups:
            group.pop("params")
        self.optimizer = PartitionedAdam([[group.partition] for group in self.groups], groups, lr=params["lr"],
                                         betas=tuple(params.get("betas", (0.9, 0.999))), eps=params.get("eps", 1e-8),
                                         weight_decay=params.get("weight_decay", 0.0), decoupled_weight_decay=True)
        scheduler = config.get("scheduler")
        self.lr_scheduler = build_scheduler(scheduler["type"], scheduler.get("params", {}), self.optimizer) \
            if scheduler else None
        self.clipping = float(config.get("gradient_clipping", 0.0))
        self.global_grad_norm = None
        self.skipped_steps = 0
        if self.stage == 2:  # Phase 2: each gradient goes to its bucket as soon as backward has it
            for group in self.groups:
                for parameter in group.parameters:
                    parameter.register_post_accumulate_grad_hook(
                        lambda parameter, group=group: lab.gradient_ready(group, parameter, self.comm))

    # Phase 1
    def __call__(self, **batch):
        return self.module(**batch)

    # Phase 2
    def backward(self, loss: torch.Tensor) -> None:
        loss.backward()

    # Phase 3
    def step(self) -> None:
        with labelled("reduce_gradients"):
            for group in self.groups:
                if self.stage == 0:
                    group.grad_partition = group.gradient_buffer()
                    self.comm.all_reduce(group.grad_partition)
                    group.grad_partition.div_(self.comm.world_size)
                elif self.stage == 1:
                    flat_gradient = group.gradient_buffer()
                    group.grad_partition = lab.reduce_scatter_gradients(flat_gradient, self.comm)
                    if group.grad_partition.untyped_storage().data_ptr() != flat_gradient.untyped_storage().data_ptr():
                        free_storage(flat_gradient)  # freed, not just dropped: the backend's worker may still hold it
        partitions = [group.grad_partition for group in self.groups]
        with labelled("unscale_clip"):
            squares = torch.zeros(1, dtype=torch.float32)
            for partition in partitions:
                squares += partition.pow(2).sum()
            self.comm.all_reduce(squares)
            self.global_grad_norm = math.sqrt(float(squares.item()))
        coefficient = self.clipping / (self.global_grad_norm + 1e-6) if self.clipping > 0 else 1.0
        if coefficient < 1.0:
            for partition in partitions:
                partition.mul_(coefficient)
        self.optimizer.step([[partition] for partition in partitions])
        del partitions
        for group in self.groups:
            free_storage(group.grad_partition)
            group.grad_partition, group.arrived = None, 0
            if self.stage > 0:
                with labelled("all_gather"):
                    lab.all_gather_parameters(group.flat, group.partition, self.comm)
        if self.lr_scheduler is not None:
            self.lr_scheduler.step()

    # What DeepSpeed's engine also answers (optional for zero-lab; the lab's check reads them)
    def get_global_grad_norm(self) -> float | None:
        return self.global_grad_norm

    def get_lr(self) -> list[float]:
        return [float(group["lr"]) for group in self.optimizer.param_groups]

    def zero_optimization_stage(self) -> int:
        return self.stage

    def gradient_accumulation_steps(self) -> int:
        return 1

    def train(self, mode: bool = True):
        self.module.train(mode)

    def eval(self):
        self.module.eval()

    def memory_breakdown(self, by_device: bool = False) -> dict:
        """Bytes this rank holds per category, counted from this engine's own tensors (nano's categories)."""
        figures = dict.fromkeys(CATEGORIES, 0)
        for group in self.groups:
            figures["parameters"] += tensor_bytes(group.flat)
            figures["gradients"] += sum(tensor_bytes(parameter.grad) for parameter in group.parameters)
            figures["gradient_partition"] += tensor_bytes(group.grad_partition)
            figures["communication_buckets"] += tensor_bytes(group.bucket)
        figures["optimizer_states"] = sum(tensor_bytes(state.get(key)) for state in self.optimizer.state.values()
                                          for key in ("exp_avg", "exp_avg_sq"))
        figures["total"] = sum(figures.values())
        return {"device": figures} if by_device else figures


def initialize(model=None, model_parameters=None, config=None, **_):
    """DeepSpeed's entry point: (engine, optimizer, dataloader, scheduler)."""
    if getattr(lab, "ON_NANO", False) and int(config.get("zero_optimization", {}).get("stage", 0)) == lab.STAGE:
        from .on_nano import initialize as initialize_on_nano  # labs zero3, fp16, offload: nano's engine, your functions

        return initialize_on_nano(model, model_parameters, config)
    engine = LabEngine(model, model_parameters if model_parameters is not None else model.parameters(), config)
    return engine, engine.optimizer, None, engine.lr_scheduler
