"""nano: a readable ZeRO engine (stages 0 to 3, CPU offload), a drop-in for `deepspeed.initialize`.

    import zero_lab.nano as deepspeed
    engine, optimizer, _, scheduler = deepspeed.initialize(model=model, model_parameters=params,
                                                           config="ds_config.json")

Vocabulary: every tensor a reader meets, and the bytes each takes on one rank (P = parameters of
a flat buffer, padded to a multiple of 2N at stages 1-3 as official DeepSpeed pads, not at stage
0; N ranks; w = 4 in fp32, 2 in bf16/fp16). What each stage partitions, and what
follows from it, is the stage table in `stages.py`.

| name                       | what it is                                                     | stage 0 | stage 1 | stage 2   | stage 3   |
|----------------------------|----------------------------------------------------------------|---------|---------|-----------|-----------|
| unit                       | parameters laid out together (stages 0-2: the whole model; stage 3: each module's own parameters or a leaf module's subtree, the root, each persistent small parameter) | | | | |
| flat parameter buffer      | one unit's parameters of one group end to end; param.data views | wP      | wP      | wP        | wP/N between uses (its partition); wP while gathered |
| gathered parameters        | stage 3: a sharded unit's whole buffer, from before its use to after it | -  | -       | -         | wP per unit in use |
| partition                  | this rank's slice [rank*P/N, (rank+1)*P/N) of a flat buffer     | all of it | P/N   | P/N       | P/N       |
| fp32 master partition      | fp32 copy of the partition that Adam updates (fp32: none, the partition itself is the master) | 4P | 4P/N | 4P/N | 4P/N |
| full gradients             | autograd's own param.grad, accumulated over the window (stage 1 with bf16 and grad_accum_dtype fp32: moved after each backward into full-size fp32 gradients, 4P, whose slice is the gradient partition) | wP | wP | - | - |
| gradient bucket            | a flat range of gradients reduced together (reduce_bucket_size) | transient | transient | transient | transient |
| gradient partition         | the partition's averaged gradients, fp32                       | 4P      | 4P/N    | 4P/N      | 4P/N      |
| optimizer-state partition  | Adam's exp_avg and exp_avg_sq for the partition, fp32          | 8P      | 8P/N    | 8P/N      | 8P/N      |

With CPU offload the fp32 master, optimizer-state and gradient partitions live in host memory
(stages 1-3), and at stage 3 the partitions of the parameters too (`offload/placement.py`).

Gradients exist only while they are needed: full gradients from backward until they are packed
into buckets, gradient partitions from the window's first reduction until the optimizer step.
`memory_formula.py` and docs/nano.md give the bytes at each moment; the tests measure them.

Layers, each importing only those listed before it:
    errors, stages, dtypes, fetch_trace, facade, memory, policies, policies.leaf_modules, config.keys, config.zeropp ->
    layout, policies.fetch_policy, policies.unit_policy ->
    config.schema, spanning_layout -> config.loading -> config -> facade.official_config, memory.memory_formula ->
    collectives, facade.distributed, placement, units, gradient_collection, external_parameters ->
    flat_buffer, gradient_buckets, adamw, loss_scaler, facade.lr_schedules, facade.client_optimizers, muon.newton_schulz,
    muon.memory ->
    gradient_reduction, sharded_flat_buffer -> coalesced_gather -> unit_gathering, memory.optimizer_memory ->
    zero_optimizer -> stage0 -> stage1 -> stage2 -> persistent_reduction -> stage3, stage1_fp32_accumulation ->
    init, init.partitions, offload, offload.placement, zeropp, zeropp.quantization, muon.groups,
    muon.partitioned_muon -> policies.stage3_units, zeropp.hierarchical_partition, muon -> zeropp.quantized_weights ->
    zeropp.quantized_gradients ->
    checkpoint -> checkpoint.reshard, checkpoint.files -> checkpoint.contents -> checkpoint.save ->
    checkpoint.load, checkpoint.offline -> facade.engine -> facade.initialize, zero (the API re-exported
    here). A module of a sub-package goes by its dotted name (`config.keys` is keys.py in the package
    config/), and the package's __init__ by the package's name (`config` re-exports the names of
    config/'s modules).
The stage path (what `stageN.py` imports, docs/nano.md "Reading path", `zero-lab explain --stage N
--reading-path`) is the top of the package, with `zero.py` (DeepSpeed's `deepspeed.zero` API) beside
it; everything else is in a room: `facade/` (what a client calls: `initialize`, the engine, the
schedules), `memory/` (the bytes per rank, by formula and by count), `policies/` (stage 3's units
and fetch rules, applied by `initialize`), `config/`, `checkpoint/`, and the optional features
`offload/`, `init/` (`zero.Init`), `zeropp/` (ZeRO++), `muon/` (the Muon optimizer: whole matrices
gathered for Newton-Schulz, docs/muon.md).
Checkpoints (the `checkpoint` package, off the step's path; docs/checkpoints.md):
`engine.save_checkpoint`/`load_checkpoint` write and read official DeepSpeed's files, and load them
at any world size (partition -> whole parameter -> partition, `checkpoint/reshard.py`).
"""

import importlib

# The API, imported on first use (PEP 562): `import zero_lab.nano.dtypes` from the CLI loads no torch.
# The facade's modules live in facade/, so importing one binds it there, never over these names here.
_API = {"initialize": "facade.initialize", "add_config_arguments": "facade.initialize",
        "init_distributed": "facade.distributed", "NanoEngine": "facade.engine", "NanoConfigError": "errors",
        "zero": None}
__all__ = list(_API)


def __getattr__(name: str):
    if name not in _API:
        raise AttributeError(f"module 'zero_lab.nano' has no attribute {name!r}")
    module = importlib.import_module(f"zero_lab.nano.{_API[name] or name}")
    value = module if _API[name] is None else getattr(module, name)
    globals()[name] = value
    return value
