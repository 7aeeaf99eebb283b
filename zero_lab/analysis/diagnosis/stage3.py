"""Stage 3's findings: what stays gathered, what was whole before it was partitioned, what a save writes.

`stage3-everything-gathered` (info; nano and official only, whose rules these are; not when nano
    measured less than half the model gathered, or every layer parameter is persistent): official's fetch rules (`nano.fetch_policy`, which nano follows)
    prefetch up to `stage3_prefetch_bucket_size` elements ahead while fewer than
    `stage3_max_live_parameters` are gathered, and keep every unit the prefetch reached until its
    backward use. With the defaults (50,000,000 and 1,000,000,000 elements) that is every layer of a
    model under a billion parameters: the model is whole on every rank at the turn from forward to
    backward, as at stage 2. `explain`'s arithmetic (`peak_memory`) gives what other values would
    release and the peak and gather traffic each would give.
`materialized-before-partition` (warning): the start-up peak (the `[model]` line's `startup_peak_bytes`:
    rank 0's live bytes from before the model was built to the end of `initialize`) held the whole
    model's parameters and was above every later step's peak: building the model whole on each
    rank, not partitioned as it is built (`zero.Init`), set the run's peak memory.
`no-16bit-weights-on-save` (warning): a stage-3 run saved checkpoints (the harness's `[ckpt]` lines, or
    the Hugging Face Trainer saying on a rank's stderr that it saved the full checkpoint instead) with
    `stage3_gather_16bit_weights_on_model_save` false: its checkpoint holds the weights only as
    each rank's partitions, and a 16-bit model save writes no weights (official's `save_16bit_model`
    returns False; the Hugging Face Trainer's `save_model` writes only the checkpoint).
"""

from __future__ import annotations

from dataclasses import replace

from zero_lab.analysis.diagnosis.finding import Finding, mb
from zero_lab.analysis.diagnosis.run_data import RunData
from zero_lab.analysis.runs.logparse import is_number
from zero_lab.analysis.memory.peak_memory import (DEEPSPEED_FETCH_RULES, decoder_micro_step, layer_parameter_sizes,
                                           layers_whole_after_forward, predict_run_peak, unit_parameters)
from zero_lab.nano.dtypes import BYTES_OF_PRECISION
from zero_lab.nano.policies.fetch_policy import FetchRules
from zero_lab.workload.meters.wire_bytes import wire_bytes

RULE_KEYS = {"prefetch_bucket_size": "stage3_prefetch_bucket_size", "max_live_parameters": "stage3_max_live_parameters",
             "max_reuse_distance": "stage3_max_reuse_distance"}


def fetch_rules(run: RunData) -> FetchRules:
    """The run's three `stage3_*` keys, from its `[zero]` line (DeepSpeed's defaults where absent)."""
    values = {field: run.log.zero.get(key) for field, key in RULE_KEYS.items()}
    return FetchRules(**{field: value if is_number(value) else getattr(DEEPSPEED_FETCH_RULES, field)
                         for field, value in values.items()})


def gathered_wire_bytes(shape, rules: FetchRules, width: int, world_size: int) -> int:
    """Bytes one rank sends per micro-step for stage 3's gathers under `rules` (all-gather's convention)."""
    layer, root = unit_parameters(shape)
    step = decoder_micro_step(shape, rules)
    numel = sum(root if unit == "root" else layer for unit in step.forward_gathers + step.backward_gathers)
    return wire_bytes("all_gather", numel * width, world_size)


def releasing_rules(shape, rules: FetchRules) -> list[tuple[str, FetchRules]]:
    """Settings that would let layers go after the forward, the first keeping the prefetch: (the key
    and value, the rules). A cap on what is live (the root and two layers) stops the prefetch short;
    a bucket of one layer lets it reach less at a time; none releases every layer after its use. A
    reuse distance that keeps layers anyway (DeepSpeed's default, 1,000,000,000) is set to 0 beside each."""
    layer, root = unit_parameters(shape)
    reuse, text = (rules, "") if rules.max_reuse_distance == 0 else (replace(rules, max_reuse_distance=0),
                                                                     ", stage3_max_reuse_distance: 0")
    return [(f"stage3_max_live_parameters: {root + 2 * layer}{text}", replace(reuse, max_live_parameters=root + 2 * layer)),
            (f"stage3_prefetch_bucket_size: {layer}{text}", replace(reuse, prefetch_bucket_size=layer)),
            (f"stage3_prefetch_bucket_size: 0{text}", replace(reuse, prefetch_bucket_size=0))]


# The engines whose stage 3 follows DeepSpeed's fetch rules; FSDP2 gathers each block again in the backward
# (reshard_after_forward), and an engine of the user's own may do anything.
DEEPSPEED_RULE_IMPLS = ("nano", "official")


def everything_gathered(run: RunData) -> list[Finding]:
    shape = run.shape()
    if (run.stage != 3 or run.impl not in DEEPSPEED_RULE_IMPLS or run.world_size is None or run.world_size < 2
            or shape is None):
        return []
    rules = fetch_rules(run)
    whole = layers_whole_after_forward(shape, rules)
    layer, root = unit_parameters(shape)
    width, world_size = BYTES_OF_PRECISION.get(run.precision, 4), run.world_size
    model_bytes = (shape.layers * layer + root) * width
    measured = [row.get("gathered_parameters_bytes") for row in run.log.phases if row.get("phase") == "after_forward"]
    measured = measured[-1] if measured and is_number(measured[-1]) else None
    threshold = run.log.zero.get("stage3_param_persistence_threshold")
    persistent = is_number(threshold) and max(layer_parameter_sizes(shape)) <= threshold  # no layer is sharded
    if 2 * whole <= shape.layers or persistent or (measured is not None and 2 * measured < model_bytes):
        return []
    evidence = [f"after the forward {whole} of {shape.layers} layers stay gathered: {mb(whole * layer * width)} of the "
                f"model's {mb(model_bytes)} ({run.precision}), beside each rank's partition of {mb(model_bytes / world_size)}",
                f"stage3_prefetch_bucket_size={rules.prefetch_bucket_size}, stage3_max_live_parameters="
                f"{rules.max_live_parameters}, stage3_max_reuse_distance={rules.max_reuse_distance}; one layer is "
                f"{layer} elements, the model {shape.layers * layer + root}"]
    if measured is not None:
        evidence.append(f"measured at the end of the forward (nano's memory_breakdown): gathered parameters "
                        f"{mb(measured)}")
    predicted = predict_run_peak(run.log.model, run.log.zero, 3, run.precision, world_size)
    now_wire = gathered_wire_bytes(shape, rules, width, world_size)
    table = [["setting", "layers gathered after the forward", "predicted peak", "gather wire bytes per micro-step"],
             ["as run", f"{whole} of {shape.layers}", mb(predicted.peak) if predicted else "?", mb(now_wire)]]
    options = []
    for setting, changed in releasing_rules(shape, rules):
        zero = {**run.log.zero, **{key: getattr(changed, field) for field, key in RULE_KEYS.items()}}
        peak = predict_run_peak(run.log.model, zero, 3, run.precision, world_size)
        wire = gathered_wire_bytes(shape, changed, width, world_size)
        table.append([setting, f"{layers_whole_after_forward(shape, changed)} of {shape.layers}",
                      mb(peak.peak) if peak else "?", mb(wire)])
        options.append({"setting": setting, "layers_gathered": layers_whole_after_forward(shape, changed),
                        "predicted_peak_bytes": peak.peak if peak else None, "wire_bytes_per_micro_step": wire})
    first = next(row for row in table[2:] if 2 * int(row[1].split()[0]) <= shape.layers)  # prefetch 0 always is
    return [Finding(
        "stage3-everything-gathered", f"{run.label}: {whole} of {shape.layers} layers stay gathered after the forward",
        evidence,
        "the prefetch reaches every layer within stage3_prefetch_bucket_size and stage3_max_live_parameters, and a "
        "unit the prefetch reached stays gathered until its backward use (official DeepSpeed's rule, which nano "
        "follows): at the turn from forward to backward the model is whole on every rank, as at stage 2",
        f"to let layers go after their use, set {first[0]} ({first[1]} layers gathered, predicted peak {first[2]}, "
        f"{first[3]} of gathers per micro-step instead of {mb(now_wire)}); the table has the others. Keeping them "
        "gathered saves the backward's gathers: leave it if the memory is there",
        runs=[run.name], table=table,
        figures={"layers_gathered": whole, "layers": shape.layers, "gathered_bytes": whole * layer * width,
                 "model_bytes": model_bytes, "predicted_peak_bytes": predicted.peak if predicted else None,
                 "wire_bytes_per_micro_step": now_wire, "options": options})]


def steady_peak_bytes(run: RunData) -> float | None:
    """The largest peak of the steps after the first (step 1's peak includes the start-up)."""
    peaks = [row["peak_alloc_max_mb"] for row in run.steps()[1:] if is_number(row.get("peak_alloc_max_mb"))]
    return max(peaks) * 2**20 if peaks else None


def materialized_before_partition(run: RunData) -> list[Finding]:
    startup, params = run.log.model.get("startup_peak_bytes"), run.log.model.get("params")
    dtype = str(run.log.model.get("param_dtype", "")).removeprefix("torch.")
    width = {"float32": 4, "bfloat16": 2, "float16": 2}.get(dtype)
    if run.stage != 3 or not is_number(startup) or not is_number(params) or width is None or not run.world_size:
        return []
    whole, steady = params * width, steady_peak_bytes(run)
    if startup < whole or steady is None or startup <= steady:
        return []
    partition = whole / run.world_size
    return [Finding(
        "materialized-before-partition", f"{run.label}: the start-up held the whole model and set the run's peak",
        [f"start-up peak {mb(startup)} (rank 0, from before the model was built to the end of initialize)",
         f"the whole model's parameters: {mb(whole)} ({params} x {width} bytes); each rank's partition: {mb(partition)}",
         f"the training steps after the first peaked at {mb(steady)}"],
        "every rank built the whole model before the engine partitioned it (no zero.Init; with Hugging Face, "
        "from_pretrained before the DeepSpeed config existed), so each rank held all of it at once",
        f"build the model partitioned: inside deepspeed.zero.Init() (nano: zero_lab.nano.zero.Init), or with Hugging "
        f"Face create TrainingArguments(deepspeed=...) or HfDeepSpeedConfig before from_pretrained. Each rank then "
        f"holds its partition ({mb(partition)}) and one module at a time while building, and the run's peak is the "
        f"training steps' {mb(steady)} instead of {mb(startup)}",
        runs=[run.name], figures={"startup_peak_bytes": startup, "whole_model_bytes": whole,
                                  "partition_bytes": partition, "steady_peak_bytes": steady})]


GATHER_KEYS = ("stage3_gather_16bit_weights_on_model_save", "stage3_gather_fp16_weights_on_model_save")


# What the Hugging Face Trainer logs when its save_model finds no whole weights to write (its own save
# path, which the harness's [ckpt] lines do not see): it then writes only the engine's checkpoint.
TRAINER_SAID = "stage3_gather_16bit_weights_on_model_save=false. Saving the full checkpoint instead"


def no_16bit_weights_on_save(run: RunData) -> list[Finding]:
    saves = [row for row in run.log.checkpoints if row.get("action") == "save"]
    trainer = run.ranks_saying(TRAINER_SAID) if run.stage == 3 else []
    if run.stage != 3 or not (saves or trainer) or any(run.zero_key(key, False) for key in GATHER_KEYS):
        return []
    params = run.log.model.get("params")
    dtype = str(run.log.model.get("param_dtype", "torch.float32")).removeprefix("torch.")
    width = {"float32": 4, "bfloat16": 2, "float16": 2}.get(dtype, 4)
    whole = params * width if is_number(params) else None
    last = saves[-1] if saves else {}
    given = {key: run.zero_key(key) for key in GATHER_KEYS if run.zero_key(key) is not None}
    setting = (f"{', '.join(f'{key} is {str(value).lower()}' for key, value in given.items())} in "
               f"{run.directory / 'config.json'}") if given else (
        f"stage3_gather_16bit_weights_on_model_save is not set in {run.directory / 'config.json'} (DeepSpeed's "
        "default: false)")
    offline = ("`zero-lab checkpoint consolidate` rebuilds the whole fp32 weights from the checkpoint offline"
               + (", as does the zero_to_fp32.py official DeepSpeed copies into the save directory"
                  if run.impl == "official" else ""))
    evidence = [setting]
    if saves:
        evidence.append(f"saved at step(s) {', '.join(str(row.get('step')) for row in saves)}; the last, "
                        f"{last.get('tag')}: {last.get('files')} files, {mb(last.get('bytes'))}, every weight only as "
                        f"{run.world_size} ranks' partitions")
    if trainer:
        evidence.append(f"rank {', '.join(map(str, trainer))} stderr (the Hugging Face Trainer's save_model): "
                        f"\"{TRAINER_SAID}\"")
    evidence.append(f"the whole model in {dtype}: {mb(whole)} ({params} parameters), written by no save")
    return [Finding(
        "no-16bit-weights-on-save", f"{run.label}: {len(saves)} save(s) without the model's whole weights" if saves
        else f"{run.label}: the Hugging Face Trainer saved without the model's whole weights",
        evidence,
        "at stage 3 no rank holds a whole weight, and without the key nothing gathers them for a save: official's "
        "engine.save_16bit_model writes nothing and returns False, accelerate's get_state_dict raises, and the "
        "Hugging Face Trainer's save_model then writes no weights file, only a checkpoint of partitions",
        f"set zero_optimization.stage3_gather_16bit_weights_on_model_save: true: a 16-bit save then gathers the "
        f"{mb(whole)} of whole weights on rank 0 and writes them; or, for the checkpoints already saved: {offline}",
        runs=[run.name], figures={"saves": len(saves), "trainer_saves": bool(trainer),
                                  "checkpoint_bytes": last.get("bytes"), "whole_model_bytes": whole})]
