"""`zero.Init` and `zero.GatheredParameters` as DeepSpeed's own unit tests use them, run the same way
against nano and official DeepSpeed, each case held to a single-process reference.

Re-expressed (for behaviour, not copied) from DeepSpeed's tests/unit/runtime/zero/test_zero_context.py
(TestZeroGatheredParametersFree, TestScatterGather, TestGatherUpdate) and tests/unit/v1/zero/test_zero.py
(TestZero3InitForParentWeightInitialization, TestZeroFrozenWeights). One spawned world runs every case.
"""

from __future__ import annotations

import copy

import torch

import zero_lab.nano as nano
from tests.nano.reference import ReferenceTrainer, build_model, loss_of, micro_batch
from tests.nano.stage3_workers import stage3_config
from tests.nano.workers import LR, MICRO_SIZE, WEIGHT_DECAY
from tests.tolerances import adam_parity_bound

STEPS = 3
TOLERANCE = adam_parity_bound(LR, STEPS)  # tests/tolerances.py: against one process summing the global batch


def _engine_module(impl: str, world_size: int):
    if impl == "nano":
        return nano
    from tests.nano.official_workers import import_official_deepspeed
    return import_official_deepspeed(world_size)


def _config(impl: str) -> dict:
    from zero_lab.nano.facade.official_config import to_official_config
    config = stage3_config()
    return config if impl == "nano" else to_official_config(config, device="cpu")


def _holds_slice(impl: str, parameter: torch.Tensor, whole: torch.Tensor, rank: int, world_size: int) -> bool:
    """Whether this rank's kept slice of a parameter partitioned by Init holds its share of
    `whole` (equal shares of ceil(numel / W); the last rank's padding is not compared)."""
    piece = parameter.zero_lab_init_partition if impl == "nano" else parameter.ds_tensor
    flat = whole.detach().reshape(-1)
    share = -(-flat.numel() // world_size)
    expected = flat[rank * share:(rank + 1) * share]
    return piece.numel() == share and torch.equal(piece[:expected.numel()], expected)


def gathered_before_initialize(deepspeed, impl, rank, world_size) -> list[str]:
    """Read the full values of parameters built under Init, before any engine; write with
    modifier_rank=0 (rank 0's values reach every rank's partition); write without a modifier
    (dropped); each exit frees what was gathered; then an engine trains from rank 0's write as
    the reference does."""
    failures, config = [], _config(impl)
    reference = build_model(seed=5)
    torch.manual_seed(5)
    with deepspeed.zero.Init(config_dict_or_path=config):
        model = build_model(seed=5)
    first = model[0].weight
    with deepspeed.zero.GatheredParameters(list(model.parameters())):
        read = max((a.detach() - b.detach()).abs().max().item()
                   for a, b in zip(model.parameters(), reference.parameters()))
        if read != 0.0 or first.numel() != reference[0].weight.numel():
            failures.append(f"read under Init: |gathered - reference| = {read}, {first.numel()} elements")
    if first.numel() != 0 or first.untyped_storage().nbytes() != 0:
        failures.append(f"after the read: {first.numel()} elements still held")
    written = torch.arange(reference[0].weight.numel(), dtype=torch.float32).reshape(reference[0].weight.shape) / 100
    with deepspeed.zero.GatheredParameters(first, modifier_rank=0):
        with torch.no_grad():
            first.copy_(written if rank == 0 else -written)
    if not _holds_slice(impl, first, written, rank, world_size):
        failures.append("modifier_rank=0: this rank's partition does not hold rank 0's write")
    with deepspeed.zero.GatheredParameters(first):
        with torch.no_grad():
            first.fill_(7.0)  # no modifier: nobody's change is kept
    with deepspeed.zero.GatheredParameters(first):
        if not torch.equal(first.detach(), written):
            failures.append("a write without modifier_rank was kept, or rank 0's write was lost")
    with torch.no_grad():
        reference[0].weight.copy_(written)
    failures += _train_against_reference(deepspeed, model, reference, config, rank, world_size, "after the write")
    return failures


def _train_against_reference(deepspeed, model, reference_model, config, rank, world_size, label) -> list[str]:
    """STEPS steps of the engine against AdamW on the global batch; every parameter compared after each."""
    failures = []
    reference = ReferenceTrainer(reference_model, LR, WEIGHT_DECAY, clipping=0.0)
    # Decay on the reference's matrices: a partitioned parameter's own data is empty (one dimension).
    decays = [reference_parameter.dim() >= 2 for reference_parameter in reference_model.parameters()]
    groups = [{"params": [parameter for parameter, decay in zip(model.parameters(), decays) if decay == wanted],
               "weight_decay": WEIGHT_DECAY if wanted else 0.0} for wanted in (True, False)]
    engine, *_ = deepspeed.initialize(model=model, model_parameters=groups, config=config)
    for step in range(STEPS):
        loss = loss_of(engine, micro_batch(step, 0, rank, MICRO_SIZE))
        engine.backward(loss)
        engine.step()
        reference.step(step, world_size, 1, MICRO_SIZE)
        with deepspeed.zero.GatheredParameters(list(model.parameters())):
            difference = max((a.detach() - b.detach()).abs().max().item()
                             for a, b in zip(model.parameters(), reference.model.parameters()))
        if not difference <= TOLERANCE:
            failures.append(f"{label}, step {step}: max |engine - reference| = {difference:.3g}")
    engine.destroy()
    return failures


class ParentInitialisesChildren(torch.nn.Module):
    """Its __init__ builds children (each partitioned at the end of its own __init__) and then
    initialises them with self.apply, with a value that differs per rank: rank 0's must win."""

    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(12, 1)
        self.wide = torch.nn.Linear(5, 7)
        self.apply(self.initialise)

    @staticmethod
    def initialise(module):
        if isinstance(module, torch.nn.Linear):
            with torch.no_grad():
                module.weight.fill_(1 + torch.distributed.get_rank())
                torch.nn.init.constant_(module.bias, 0.5)


def parent_initialises_children(deepspeed, impl, rank, world_size) -> list[str]:
    """Module.apply inside Init gathers, applies, broadcasts rank 0's values and re-partitions:
    weights 1 and biases 0.5 on every rank, as a single process (rank 0) builds them; also for
    an apply run on a built model inside the block."""
    failures, config = [], _config(impl)
    with deepspeed.zero.Init(config_dict_or_path=config):
        model = ParentInitialisesChildren()
        if model.wide.weight.numel() != 0:
            failures.append("the children were not partitioned before the parent's apply")
        late = torch.nn.Linear(4, 3)
        late.apply(lambda module: torch.nn.init.constant_(module.weight, 0.25 + rank)
                   if isinstance(module, torch.nn.Linear) else None)
    for linear, (rows, columns) in ((model.linear, (1, 12)), (model.wide, (7, 5))):
        if not _holds_slice(impl, linear.weight, torch.ones(rows, columns), rank, world_size):
            failures.append(f"Linear({columns}, {rows}).weight: this rank's partition is not rank 0's 1.0")
    with deepspeed.zero.GatheredParameters(list(model.parameters()) + list(late.parameters())):
        for name, parameter in list(model.named_parameters()) + [("late.weight", late.weight)]:
            expected = 0.25 if name == "late.weight" else 0.5 if name.endswith("bias") else 1.0
            if not torch.equal(parameter.detach(), torch.full_like(parameter.detach(), expected)):
                failures.append(f"{name} gathered: not {expected} on rank {rank}")
    return failures


def frozen_weights(deepspeed, impl, rank, world_size) -> list[str]:
    """A model built under Init with its last Linear frozen: the frozen weights never move and
    the trainable ones follow AdamW on the global batch, which skips the frozen ones."""
    failures, config = [], _config(impl)
    reference = build_model(seed=9)
    with deepspeed.zero.Init(config_dict_or_path=config):
        model = build_model(seed=9)
    for frozen in (model[3], reference[3]):
        frozen.weight.requires_grad_(False)
        frozen.bias.requires_grad_(False)
    initial = copy.deepcopy(reference[3])
    failures += _train_against_reference(deepspeed, model, reference, config, rank, world_size, "frozen")
    with deepspeed.zero.GatheredParameters(list(model[3].parameters())):
        moved = max((model[3].weight - initial.weight).abs().max().item(),
                    (model[3].bias - initial.bias).abs().max().item())
    if moved != 0.0:
        failures.append(f"frozen weights moved by {moved}")
    return failures


def gathered_parameters_free(deepspeed, impl, rank, world_size) -> list[str]:
    """GatheredParameters frees what it gathered, before an engine and on a stage-3 engine: no
    parameter storage is left inside the module after the block."""
    failures, config = [], _config(impl)
    with deepspeed.zero.Init(config_dict_or_path=config):
        model = build_model(seed=2)
    for label in ("before initialize", "on the engine"):
        sharded = [model[0].weight, model[3].weight]  # larger than the persistence threshold
        with deepspeed.zero.GatheredParameters(list(model.parameters())):
            held = [parameter.untyped_storage().nbytes() for parameter in sharded]
            if any(nbytes < parameter.numel() * 4 or parameter.numel() == 0 for nbytes, parameter in zip(held, sharded)):
                failures.append(f"{label}: gathered parameters hold {held} bytes")
        left = [parameter.untyped_storage().nbytes() for parameter in sharded]
        if any(left):
            failures.append(f"{label}: {left} bytes still held after GatheredParameters")
        if label == "before initialize":
            engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    engine.destroy()
    return failures


def scatter_gather_round_trip(deepspeed, impl, rank, world_size) -> list[str]:
    """Under Init a Linear is partitioned (0 elements outside a gather) and one built after the
    block is not; gathered it equals the single-process build; rank W-1 zeroing it with
    modifier_rank=W-1 reaches every rank."""
    failures, config = [], _config(impl)
    torch.manual_seed(11)
    single = torch.nn.Linear(6, 3)
    torch.manual_seed(11)
    with deepspeed.zero.Init(config_dict_or_path=config):
        partitioned = torch.nn.Linear(6, 3)
    outside = torch.nn.Linear(6, 3)
    if partitioned.weight.numel() != 0 or outside.weight.numel() != 18:
        failures.append(f"after the block: {partitioned.weight.numel()} and {outside.weight.numel()} elements")
    with deepspeed.zero.GatheredParameters(partitioned.weight):
        if not torch.equal(partitioned.weight.detach(), single.weight.detach()):
            failures.append("gathered: not the single-process Linear's weight")
    last = world_size - 1
    with deepspeed.zero.GatheredParameters(partitioned.weight, modifier_rank=last):
        if rank == last:
            with torch.no_grad():
                partitioned.weight.zero_()
    with deepspeed.zero.GatheredParameters(partitioned.weight):
        if not torch.equal(partitioned.weight.detach(), torch.zeros(3, 6)):
            failures.append(f"rank {last}'s zeros did not reach rank {rank}")
    return failures


CASES = (gathered_before_initialize, parent_initialises_children, frozen_weights, gathered_parameters_free,
         scatter_gather_round_trip)


def zero_context_worker(rank: int, world_size: int, impl: str) -> list[str]:
    """Every case on one world; a case's failures are named by it."""
    deepspeed = _engine_module(impl, world_size)
    failures = []
    for case in CASES:
        try:
            failures += [f"{impl} {case.__name__}: {failure}" for failure in case(deepspeed, impl, rank, world_size)]
        except Exception as error:  # one case's crash does not hide the others'
            failures.append(f"{impl} {case.__name__} raised {type(error).__name__}: {error}")
    return failures
