"""Per-rank bodies for stage 3's external parameters: a parameter a module uses but does not own.

Four small token models (TrapNet's task, `stage3_reference`), one for each way a module meets a
parameter of another module's unit:
    ParentReadsChild      the parent's forward reads `self.linear1.weight` (DeepSpeed's
                          `test_ext_param_getattr`);
    FunctionalTiedHead    a head module reads the embedding's weight for `F.linear`;
    RootParameterInChild  a child's forward reads a parameter of the model itself;
    HeldByReference       the parent keeps its child's weight in a list and uses it without reading
                          it by name, so nothing sees the read: it is registered with
                          `zero.register_external_parameter`, as DeepSpeed's docstring shows.
Each trains with nano and with official DeepSpeed in the same world, beside the single-process
AdamW reference, under three fetch configs. Each parameter's size is a multiple of 2N at N = 2 and
3 (nano pads a flat buffer to 2N, official a parameter to N), so their gathers move equal bytes.
Each model returns log-probabilities computed in its own forward, not a child's output tensor as
it is: of two modules whose output is one tensor, official meets the outer one first in the
backward (its wrapper of the output is applied last), nano the inner one, and that order moves
the release rule's count, whatever the parameters are.
"""

from __future__ import annotations

import contextlib
import copy
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

import zero_lab.nano as nano
from zero_lab.nano.external_parameters import external_parameters
from zero_lab.nano.facade.official_config import to_official_config
from zero_lab.workload.meters.comm_meter import CommMeter
from tests.nano.gather_bytes_workers import all_gathers
from tests.nano.stage3_reference import VOCAB, Block, TokenReference, decay_groups, token_batch, token_loss
from tests.nano.stage3_reference import WIDTH as BLOCK_WIDTH
from tests.nano.stage3_workers import MICRO_SIZE, TOLERANCE, stage3_config
from tests.nano.workers import LR, WEIGHT_DECAY

STEPS, WIDTH = 3, 12  # VOCAB x WIDTH and WIDTH x WIDTH elements: multiples of 4 and 6; biases persistent


class ParentReadsChild(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, WIDTH)
        self.linear1 = torch.nn.Linear(WIDTH, WIDTH)
        self.linear2 = torch.nn.Linear(WIDTH, WIDTH)
        self.head = torch.nn.Linear(WIDTH, VOCAB)

    def forward(self, ids):
        hidden = self.linear2(self.linear1(self.embed(ids)))
        hidden = torch.tanh(F.linear(hidden, self.linear1.weight))  # linear1's weight, read by its parent
        return self.head(hidden).log_softmax(-1)


class TiedHead(torch.nn.Module):
    def __init__(self, embed: torch.nn.Embedding):
        super().__init__()
        self.embed = embed  # the model's embedding, a child of both

    def forward(self, hidden):
        return F.linear(hidden, self.embed.weight)


class FunctionalTiedHead(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, WIDTH)
        self.linear = torch.nn.Linear(WIDTH, WIDTH)
        self.head = TiedHead(self.embed)

    def forward(self, ids):
        return self.head(torch.tanh(self.linear(self.embed(ids)))).log_softmax(-1)


class ReadsRootParameter(torch.nn.Module):
    def __init__(self, owner: torch.nn.Module):
        super().__init__()
        self.linear = torch.nn.Linear(WIDTH, WIDTH)
        object.__setattr__(self, "owner", owner)  # a reference, not a submodule

    def forward(self, hidden):
        return torch.tanh(self.linear(hidden)) @ self.owner.mix


class RootParameterInChild(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, WIDTH)
        self.mix = torch.nn.Parameter(torch.randn(WIDTH, WIDTH) / WIDTH ** 0.5)
        self.child = ReadsRootParameter(self)
        self.head = torch.nn.Linear(WIDTH, VOCAB)

    def forward(self, ids):
        return self.head(self.child(self.embed(ids))).log_softmax(-1)


class HeldByReference(ParentReadsChild):
    def __init__(self):
        super().__init__()
        self.shared = [self.linear1.weight]  # used below without a read by name

    def forward(self, ids):
        hidden = self.linear1(self.embed(ids))
        return self.head(torch.tanh(self.linear2(hidden) + F.linear(hidden, self.shared[0]))).log_softmax(-1)


class GathersForItsForward(HeldByReference):
    gathered_parameters = staticmethod(lambda *parameters, **options: contextlib.nullcontext())  # the reference's

    def forward(self, ids):
        hidden = self.linear1(self.embed(ids))
        with self.gathered_parameters(self.shared[0], fwd_module=self):  # DeepSpeed's docstring example
            mixed = F.linear(hidden, self.shared[0])
        return self.head(torch.tanh(self.linear2(hidden) + mixed)).log_softmax(-1)


def register_shared(zero, model: torch.nn.Module) -> None:
    zero.register_external_parameter(model, model.linear1.weight)


def gather_with_fwd_module(zero, model: torch.nn.Module) -> None:
    model.gathered_parameters = zero.GatheredParameters


MODELS = {"parent reads a child's weight": (ParentReadsChild, None),
          "tied head reads the embedding": (FunctionalTiedHead, None),
          "child reads the model's parameter": (RootParameterInChild, None),
          "registered": (HeldByReference, register_shared)}


def configs() -> dict[str, dict]:
    """Stage 3 (biases persistent) with prefetch, without, and at DeepSpeed's default reuse distance."""
    cases = {"prefetch 5e7, reuse 0, accumulation 2, clipping": (50_000_000, 0, 2, 0.5),
             "prefetch 0, reuse 0": (0, 0, 1, 0.0), "prefetch 0, reuse 1e9": (0, 1_000_000_000, 1, 0.0)}
    built = {}
    for label, (prefetch, reuse, accumulation, clipping) in cases.items():
        config = stage3_config(persistence=WIDTH, accumulation=accumulation, clipping=clipping)
        config["zero_optimization"].update(stage3_prefetch_bucket_size=prefetch, stage3_max_reuse_distance=reuse)
        built[label] = config
    return built


def whole_sharded(model: torch.nn.Module, engine) -> set[str]:
    """The parameters whole or being gathered at this moment (a prefetch in flight), of those each
    engine partitions between uses: official's
    not persistent ones, nano's of sharded units other than the root (which nano holds through the
    whole micro-step, where official gathers the model's own parameters for each of its uses)."""
    gathering = getattr(engine.optimizer, "gathering", None)
    whole = set()
    for name, parameter in model.named_parameters():
        if gathering is None:
            if not parameter.ds_persist and parameter.ds_status.name != "NOT_AVAILABLE":  # whole or in flight
                whole.add(name)
        else:
            entry = gathering.owner.get(id(parameter))
            if entry is not None and entry is not gathering.root and entry.gathered:
                whole.add(name)
    return whole


def registered(model: torch.nn.Module, official: bool) -> dict[str, list[str]]:
    """Module name -> the names of the parameters registered as external to it."""
    names = {id(parameter): name for name, parameter in model.named_parameters()}
    found = {}
    for module_name, module in model.named_modules():
        parameters = list(getattr(module, "_external_params", {}).values()) if official else external_parameters(module)
        if parameters:
            found[module_name or "model"] = [names[id(parameter)] for parameter in parameters]
    return found


@dataclass
class Run:
    """One engine's training: per micro-step the loss, the all-gathers (calls, wire bytes) from its
    forward through its step, and the partitioned parameters whole as each module's forward begins,
    after the forward and after the backward; then every parameter, gathered, and the registrations."""

    losses: list[float] = field(default_factory=list)
    gathers: list[tuple[int, int]] = field(default_factory=list)
    during_forward: list[list[set[str]]] = field(default_factory=list)
    after_forward: list[set[str]] = field(default_factory=list)
    after_backward: list[set[str]] = field(default_factory=list)
    parameters: list[torch.Tensor] = field(default_factory=list)
    registered: dict[str, list[str]] = field(default_factory=dict)
    root: set[str] = field(default_factory=set)  # nano: the root unit's parameters (the model's own)


def train(module, model, config: dict, rank: int, meter: CommMeter, after_step=None) -> Run:
    """STEPS optimizer steps; `after_step(step, engine)` runs after each."""
    engine, *_ = module.initialize(model=model, model_parameters=decay_groups(model, WEIGHT_DECAY), config=config)
    run = Run()
    for inner in model.modules():  # after the engine's own hooks: what the module's forward meets
        inner.register_forward_pre_hook(lambda *_: run.during_forward[-1].append(whole_sharded(model, engine)))
    for step in range(STEPS):
        for micro in range(config["gradient_accumulation_steps"]):
            before = meter.snapshot()
            run.during_forward.append([])
            loss = token_loss(engine, token_batch(step, micro, rank, MICRO_SIZE))
            run.after_forward.append(whole_sharded(model, engine))
            engine.backward(loss)
            run.after_backward.append(whole_sharded(model, engine))
            engine.step()
            run.gathers.append(all_gathers(meter, before))
            run.losses.append(loss.item())
        if after_step is not None:
            after_step(step, engine)
    with module.zero.GatheredParameters(list(model.parameters())):
        run.parameters = [parameter.detach().float().clone() for parameter in model.parameters()]
    run.registered = registered(model, official=module is not nano)
    root = getattr(getattr(engine.optimizer, "gathering", None), "root", None)
    if root is not None:
        names = {id(parameter): name for name, parameter in model.named_parameters()}
        run.root = {names[id(parameter)] for parameter in root.unit.parameters}
    return run


def nano_checks(model, reference: TokenReference, world_size: int, accumulation: int, failures: list[str], label: str):
    """An `after_step` for nano: every parameter equals the reference's, and nothing stays gathered."""
    def after_step(step, engine):
        reference.step(step, world_size, accumulation, MICRO_SIZE)
        with nano.zero.GatheredParameters(list(model.parameters())):
            difference = max((mine.detach() - theirs.detach()).abs().max().item()
                             for mine, theirs in zip(model.parameters(), reference.model.parameters()))
        gathered = engine.memory_breakdown()["gathered_parameters"]
        if not difference <= TOLERANCE or gathered:
            failures.append(f"{label} step {step}: max |nano - reference| = {difference:.3g}, {gathered} B gathered")
    return after_step


def beside_official(label: str, mine: Run, theirs: Run, accumulation: int) -> list[str]:
    """nano's run against official's: losses and parameters within TOLERANCE, the same registrations,
    the same parameters whole after each forward and backward, and from the second optimizer step
    on the same all-gather bytes per micro-step in no more calls (official gathers the persistent
    parameters after a step one call each, nano in one). The first step differs: official records
    its trace in the first micro-step and frees its persistent parameters after every use then,
    gathering them again with later fetches until the step's publish. The model's own parameters
    (nano's root unit) are held by nano for the whole micro-step and gathered per use by official:
    they are left out of the comparison of what is whole, and with them nano may gather less."""
    failures = []
    worst_loss = max(abs(a - b) for a, b in zip(mine.losses, theirs.losses))
    worst_parameter = max((a - b).abs().max().item() for a, b in zip(mine.parameters, theirs.parameters))
    if not (worst_loss <= TOLERANCE and worst_parameter <= TOLERANCE):
        failures.append(f"{label}: max loss delta {worst_loss:.3g}, max parameter delta {worst_parameter:.3g}")
    if mine.registered != theirs.registered:
        failures.append(f"{label}: registered as external: nano {mine.registered}, official {theirs.registered}")
    for moment in ("after_forward", "after_backward"):
        if getattr(mine, moment) != [whole - mine.root for whole in getattr(theirs, moment)]:
            failures.append(f"{label}: whole {moment}: nano {getattr(mine, moment)}, official {getattr(theirs, moment)}")
    theirs_during = [[whole - mine.root for whole in micro] for micro in theirs.during_forward]
    if mine.during_forward[accumulation:] != theirs_during[accumulation:]:
        differing = [(micro, index, sorted(a), sorted(b)) for micro, (ours, others) in
                     enumerate(zip(mine.during_forward, theirs_during)) if micro >= accumulation
                     for index, (a, b) in enumerate(zip(ours, others)) if a != b]
        failures.append(f"{label}: whole as each module's forward begins (micro-step, module call, nano, "
                        f"official): {differing}")
    steady_mine, steady_theirs = mine.gathers[accumulation:], theirs.gathers[accumulation:]
    if len(steady_mine) != len(steady_theirs) or any(  # nano's root may gather less (see above)
            calls > their_calls or (wire > their_wire if mine.root else wire != their_wire)
            for (calls, wire), (their_calls, their_wire) in zip(steady_mine, steady_theirs)):
        failures.append(f"{label}: all-gathers (calls, wire bytes) per micro-step nano {mine.gathers}, "
                        f"official {theirs.gathers}")
    return failures


def side_by_side_worker(rank: int, world_size: int) -> list[str]:
    """Each model under each config: nano equals the reference after every step and official
    DeepSpeed everywhere `beside_official` looks; at prefetch 0 and reuse distance 0 nothing
    partitioned stays whole after a forward (the external parameter was freed with its user)."""
    meter = CommMeter().install()  # before DeepSpeed keeps references to the collectives
    from tests.nano.official_workers import import_official_deepspeed

    deepspeed = import_official_deepspeed(world_size)
    failures = []
    for model_label, (build, register) in MODELS.items():
        torch.manual_seed(0)
        initial = build()
        for config_label, config in configs().items():
            label = f"W={world_size} {model_label}, {config_label}"
            reference = TokenReference(initial, LR, WEIGHT_DECAY, config["gradient_clipping"])
            runs = {}
            for name, module, received in (("nano", nano, config),
                                           ("official", deepspeed, to_official_config(config, device="cpu"))):
                model = copy.deepcopy(initial)
                if register is not None:
                    register(module.zero, model)
                checks = (nano_checks(model, reference, world_size, config["gradient_accumulation_steps"], failures,
                                      label) if module is nano else None)
                runs[name] = train(module, model, received, rank, meter, checks)
            print(f"[external] rank {rank} {label}: registered {runs['nano'].registered}; all-gathers nano "
                  f"{runs['nano'].gathers} official {runs['official'].gathers}; whole after forward nano "
                  f"{runs['nano'].after_forward} official {runs['official'].after_forward}", flush=True)
            failures += beside_official(label, runs["nano"], runs["official"], config["gradient_accumulation_steps"])
            if config_label == "prefetch 0, reuse 0" and any(runs["nano"].after_forward):
                failures.append(f"{label}: whole after a forward {runs['nano'].after_forward}")
    meter.uninstall()
    return failures


def api_outcomes(zero, registry) -> list[str]:
    """What DeepSpeed's two calls do on a plain module, step by step (`registry(module)`: the
    parameters registered to it); each error by its type and message."""
    module = torch.nn.Linear(2, 2)
    calls = [("register", module.weight), ("register", module.weight), ("register", module.bias),
             ("unregister", module.weight), ("unregister", module.weight), ("register", torch.zeros(2)),
             ("unregister", torch.zeros(2))]
    outcomes = []
    for verb, parameter in calls:
        call = zero.register_external_parameter if verb == "register" else zero.unregister_external_parameter
        try:
            call(module, parameter)
            outcomes.append(f"{verb}: {[tuple(known.shape) for known in registry(module)]}")
        except Exception as error:  # noqa: BLE001 - the error itself is what is compared
            outcomes.append(f"{verb}: {type(error).__name__}: {error}")
    return outcomes


def api_worker(rank: int, world_size: int) -> list[str]:
    """`register_external_parameter` and `unregister_external_parameter` do what official's do, errors
    included; official offers the first as `deepspeed.zero.register_external_parameter` too, as the
    drop-in does (tests/clients/test_dropin_package.py)."""
    from tests.nano.official_workers import import_official_deepspeed

    deepspeed = import_official_deepspeed(world_size)
    from deepspeed.runtime.zero import partition_parameters

    ours = api_outcomes(nano.zero, external_parameters)
    theirs = api_outcomes(partition_parameters, lambda module: list(getattr(module, "_external_params", {}).values()))
    failures = [] if ours == theirs else [f"nano {ours}, official {theirs}"]
    if deepspeed.zero.register_external_parameter is not partition_parameters.register_external_parameter:
        failures.append("official's deepspeed.zero.register_external_parameter is not partition_parameters'")
    return failures


class CallsIntoALeaf(torch.nn.Module):
    """The model calls a module inside a leaf module (`leaf_module: Block`, TrapNet's block) by itself."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, BLOCK_WIDTH)
        self.block = Block()
        self.head = torch.nn.Linear(BLOCK_WIDTH, VOCAB)

    def forward(self, ids):
        hidden = self.block(self.embed(ids))
        return self.head(torch.tanh(self.block.linear(hidden))).log_softmax(-1)


def leaf_config() -> dict:
    """Stage 3 with TrapNet's block a leaf module: one unit, gathered whole for the block's forward."""
    config = stage3_config()
    config["zero_optimization"]["leaf_module"] = {"classes": ["Block"]}
    return config


def leaf_module_worker(rank: int, world_size: int) -> list[str]:
    """A module inside a leaf module, called by the model's own forward, reads its weight while the
    leaf's unit is not whole: the read gathers it (registered to the model), and training equals the
    reference, nothing gathered after a step. Called by itself outside any forward, it raises the
    one-line error the README quotes, naming the parameter and its unit."""
    failures = []
    torch.manual_seed(0)
    initial = CallsIntoALeaf()
    config = leaf_config()
    reference = TokenReference(initial, LR, WEIGHT_DECAY, 0.0)
    model = copy.deepcopy(initial)
    train(nano, model, config, rank, CommMeter(), nano_checks(model, reference, world_size, 1, failures, "leaf"))
    if registered(model, official=False) != {"model": ["block.linear.weight"]}:
        failures.append(f"registered {registered(model, official=False)}")
    try:
        model.block.linear(torch.zeros(1, BLOCK_WIDTH))
        failures.append("a module of a leaf module called outside the forward did not raise")
    except RuntimeError as error:
        expected = ("stage 3: block.linear.weight is used while its unit 'block' is not gathered (a parameter "
                    "used outside its unit)")
        if not str(error).startswith(expected):
            failures.append(f"the error reads {error}")
    return failures


def official_outside_forward_worker(rank: int, world_size: int) -> list[str]:
    """Official DeepSpeed gathers nothing for a read outside the model's forward: after a step, the
    module inside a leaf module that `leaf_module_worker` calls by itself fails there too (its
    weight holds no elements), while inside the forward it trains."""
    from tests.nano.official_workers import import_official_deepspeed

    deepspeed = import_official_deepspeed(world_size)
    torch.manual_seed(0)
    model = CallsIntoALeaf()
    config = leaf_config()
    engine, *_ = deepspeed.initialize(model=model, model_parameters=decay_groups(model, WEIGHT_DECAY),
                                      config=to_official_config(config, device="cpu"))
    engine.backward(token_loss(engine, token_batch(0, 0, rank, MICRO_SIZE)))
    engine.step()
    if model.block.linear.weight.numel() != 0:
        return [f"official's weight is whole outside the forward: {tuple(model.block.linear.weight.shape)}"]
    try:
        model.block.linear(torch.zeros(1, BLOCK_WIDTH))
    except RuntimeError:  # official's reads "mat2 must be a matrix, got 1-D tensor"
        return []
    return ["official ran a module of a leaf module outside the forward"]


def fwd_module_worker(rank: int, world_size: int) -> list[str]:
    """DeepSpeed's docstring example of `GatheredParameters(weight, fwd_module=self)` inside a forward,
    which registers the weight as the module's external parameter: nano trains as the reference
    (the context's hold and the module's compose), where official 0.19.8 refuses from the second
    micro-step on, its context's exit freeing a parameter the module's use still holds."""
    from tests.nano.official_workers import import_official_deepspeed

    deepspeed = import_official_deepspeed(world_size)
    failures = []
    torch.manual_seed(0)
    initial = GathersForItsForward()
    config = configs()["prefetch 0, reuse 0"]
    reference = TokenReference(initial, LR, WEIGHT_DECAY, 0.0)
    meter = CommMeter()
    model = copy.deepcopy(initial)
    gather_with_fwd_module(nano.zero, model)
    run = train(nano, model, config, rank, meter, nano_checks(model, reference, world_size, 1, failures, "fwd_module"))
    if run.registered != {"model": ["linear1.weight"]}:
        failures.append(f"nano registered {run.registered}")
    model = copy.deepcopy(initial)
    gather_with_fwd_module(deepspeed.zero, model)
    try:
        train(deepspeed, model, to_official_config(config, device="cpu"), rank, meter)
        failures.append("official trained the fwd_module example")
    except RuntimeError as error:
        if "Cannot free a ZeRO-3 parameter while it is still active in submodules" not in str(error):
            failures.append(f"official failed otherwise: {error}")
    return failures


def marked_leaf_worker(rank: int, world_size: int) -> list[str]:
    """`deepspeed.utils.set_z3_leaf_modules(model, [Block])`, official's API, marks the block in the model
    instead of the config: the same units as `leaf_module: Block`, and training equals the reference."""
    from zero_lab.nano.policies.leaf_modules import get_z3_leaf_modules, set_z3_leaf_modules

    failures = []
    torch.manual_seed(0)
    initial = CallsIntoALeaf()
    reference = TokenReference(initial, LR, WEIGHT_DECAY, 0.0)
    by_config, *_ = nano.initialize(model=copy.deepcopy(initial), config=leaf_config())
    expected = [entry.unit.name for entry in by_config.optimizer.gathering.entries]
    model = copy.deepcopy(initial)
    marked = set_z3_leaf_modules(model, [Block])
    if marked != [model.block] or get_z3_leaf_modules(model) != [model.block]:
        failures.append(f"marked {marked}")
    units: list[str] = []
    checks = nano_checks(model, reference, world_size, 1, failures, "marked")

    def after_step(step, engine):
        units[:] = [entry.unit.name for entry in engine.optimizer.gathering.entries]
        checks(step, engine)

    train(nano, model, stage3_config(), rank, CommMeter(), after_step)
    if units != expected or "block" not in units:
        failures.append(f"units {units}, with the config's leaf_module {expected}")
    try:
        set_z3_leaf_modules(model, ["NoSuchBlock"])
        failures.append("marking a class the model lacks did not raise")
    except ValueError as error:
        if "no module of class NoSuchBlock in the model" not in str(error):
            failures.append(f"the error reads {error}")
    return failures
