"""Before anything launches: will each run fit in the memory the device offers?

Phase 1: `offered_memory`: what the device offers - `--device-memory GB` when given (per GPU on
         CUDA, the host's on CPU), else the least free memory among the visible GPUs
         (`free_gpu_bytes`: `torch.cuda.mem_get_info`, asked in a child process), or on CPU the
         host's available memory under the tightest of the machine and its container
         (zero_lab.launch.memory_watch).
Phase 2: `job_prediction`: each job's predicted peak per rank, the estimate its report will carry
         (`peak_memory.predict_run_peak`, from the same `[model]` and `[zero]` fields the harness
         will log, offload included); None where there is none (an unreadable architecture, a
         user's script). `needed_per_rank` reads it in the unit the memory limits: on CUDA the
         device's reserved bytes (its tensors, without what offload moved to the host, and what the
         caching allocator keeps cached), on CPU the resident bytes (analysis.memory.resident).
Phase 3: the verdict per job (analysis.memory.memory_fit); a tight one is a warning. One that will not
         fit is refused with the cheapest change that fits (`cheapest_fit`: the same prediction for
         each of `changes`, cheapest first), unless --force: `check` (run) stops the command with exit 2;
         `admit` (compare) runs the cells that fit and makes each refused one a `refused` row, and
         stops the command only when none fits.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import subprocess
import sys

from zero_lab.analysis.memory.memory_fit import KNOBS, TIGHT_FRACTION, Fit, fit, fit_line
from zero_lab.analysis.runs.rundir import not_run_summary
from zero_lab.cli.errors import BadInput
from zero_lab.nano.dtypes import PRECISION_OF_DTYPE_NAME
from zero_lab.workload.log_contract.log_lines import MB as MIB, size_text

GB = 2**30


# Run by `free_gpu_bytes` in a child process: asking a GPU its free memory makes a CUDA context on
# it (hundreds of MB of its memory), which would stay in the CLI's process on every GPU for the
# whole comparison, beside the runs'. The child's contexts end with it.
FREE_GPU_BYTES = ("import json, torch; print(json.dumps([torch.cuda.mem_get_info(index)[0] for index in "
                  "range(torch.cuda.device_count())] if torch.cuda.is_available() else []))")


def free_gpu_bytes(run=subprocess.run) -> list[int]:
    """Free bytes of each GPU this process's torch would see, asked by a child process (empty when
    it sees none, or the child fails)."""
    try:
        done = run([sys.executable, "-c", FREE_GPU_BYTES], capture_output=True, text=True, timeout=300)
        return [int(free) for free in json.loads(done.stdout.strip().splitlines()[-1])] if done.returncode == 0 else []
    except (OSError, subprocess.TimeoutExpired, ValueError, IndexError):
        return []


def offered_memory(device: str, device_memory_gb: float | None) -> tuple[int | None, str]:
    """Phase 1: (bytes one memory offers, where the figure comes from)."""
    if device_memory_gb is not None:
        return int(device_memory_gb * GB), "--device-memory"
    if device == "cuda":
        free = free_gpu_bytes()
        return (min(free), "free memory of a GPU") if free else (None, "no CUDA device")
    from zero_lab.launch.memory_watch import CGROUP_ROOT, tightest_ceiling

    ceiling = tightest_ceiling(0, None, CGROUP_ROOT)
    return ceiling.available, f"available host memory, {ceiling.name}"


def expected_optimizer(impl: str, device: str, config: dict) -> str | None:
    """The `[model]` line's optimizer the run will step with, as the harness picks it: official runs
    torch's AdamW on CPU (`torch_adam`) or where the config asks for it, else FusedAdam (the CUDA
    toolkit assumed); nano its own."""
    if impl != "official":
        return "PartitionedAdam" if impl == "nano" else None
    torch_adam = (config.get("optimizer") or {}).get("params", {}).get("torch_adam")
    return "torch.optim.AdamW" if device != "cuda" or torch_adam else "FusedAdam"


def job_prediction(job):
    """Phase 2: a prepared job's (zero_lab.cli.jobs.Job) `PeakPrediction` for one rank, None where nothing
    predicts it."""
    from zero_lab.analysis.memory.peak_memory import predict_run_peak
    from zero_lab.nano.config import load_config, without_official_only_keys
    from zero_lab.workload.model_shapes import DEFAULT_SEQ_LEN

    spec = job.spec
    if spec.script is not None:  # the model is the script's: nothing to predict it from
        return None
    world_size = spec.multi_node.world_size(spec.nproc) or spec.nproc
    settings = load_config(without_official_only_keys(job.config), world_size=world_size)  # as nano reads it
    model = {"name": spec.workload.model, "seq_len": spec.workload.seq_len or DEFAULT_SEQ_LEN,
             "micro_batch": int(job.config["train_micro_batch_size_per_gpu"]), "attn_impl": spec.workload.attn_impl,
             "gradient_checkpointing": spec.workload.gradient_checkpointing, "device": spec.device,
             "optimizer": expected_optimizer(spec.impl, spec.device, job.config)}
    sections = settings.zero_optimization
    zero = {"impl": spec.impl, "reduce_bucket_size": sections.reduce_bucket_size,
            "communication_data_type": settings.communication_data_type or "auto",
            "gradient_accumulation_steps": int(job.config.get("gradient_accumulation_steps") or 1),
            "offload_optimizer": sections.offload_optimizer.device, "offload_param": sections.offload_param.device}
    return predict_run_peak(model, zero, spec.stage, PRECISION_OF_DTYPE_NAME[spec.workload.dtype], world_size)


def needed_per_rank(job, device: str) -> int | None:
    """One rank's predicted peak in the unit its memory limits: on a CPU host the resident bytes (the
    tensors, what the heap keeps and what the process holds beside them: `analysis.memory.resident`), on a
    GPU the reserved bytes (the tensors and what the caching allocator keeps cached beside them)."""
    from zero_lab.analysis.memory.resident import predicted_resident_bytes

    prediction = job_prediction(job)
    return predicted_resident_bytes(prediction, job.spec.impl, device) if prediction is not None else None


def measure_name(device: str) -> str:
    return "predicted reserved" if device == "cuda" else "predicted resident"


def verdicts(jobs: list, device: str, offered: int | None, offered_name: str) -> list[tuple[object, Fit, str | None]]:
    """(job, verdict, the line with its figures, None without a verdict) for every job."""
    found = []
    for job in jobs:
        peak = needed_per_rank(job, device)
        ranks = ranks_sharing_a_memory(job, device)
        verdict = fit(peak * ranks if peak is not None else None, offered)
        judged = verdict is not Fit.NO_VERDICT
        line = fit_line(job.label, peak, ranks, offered, offered_name, verdict, measure_name(device)) if judged else None
        found.append((job, verdict, line))
    return found


def add_row_verdicts(rows: list[dict], device: str, device_memory_gb: float | None, offload: str) -> str:
    """`estimate`: each row's `fit` (a Fit's value) for its predicted peak, on a CPU host with what the heap
    keeps and what a rank holds beside its tensors, on a GPU with what the caching allocator keeps cached;
    returns what was offered, in words."""
    from zero_lab.analysis.memory.resident import resident_bytes

    offered, offered_name = offered_memory(device, device_memory_gb)
    for row in rows:
        peak = row.get("predicted_peak_mb")
        ranks = 1 if device == "cuda" else row["world_size"]
        judged = peak is not None and not (device == "cuda" and offload != "none")
        if judged:  # the row's figures are nano's
            needed = (int((peak + row["cached_mb"]) * MIB) if device == "cuda"
                      else resident_bytes(int(peak * MIB), int(row["heap_kept_mb"] * MIB), "nano"))
        row["fit"] = fit(needed * ranks if judged else None, offered).value
    return f"{size_text(offered)} ({offered_name})" if offered is not None else offered_name


def ranks_sharing_a_memory(job, device: str) -> int:
    return 1 if device == "cuda" else job.spec.nproc  # a GPU each, or one host for the node's ranks


def changed(job, stage: int | None = None, nproc: int | None = None, config: dict | None = None, **workload):
    """`job` with one change to its launch, its config (`config`: zero_optimization keys, or the
    micro-batch) or its workload's flags; nothing else of it differs."""
    spec, new_config = job.spec, copy.deepcopy(job.config)
    for key, value in (config or {}).items():
        (new_config if key == "train_micro_batch_size_per_gpu" else new_config["zero_optimization"])[key] = value
    if stage is not None:
        new_config["zero_optimization"]["stage"] = stage
    spec = dataclasses.replace(spec, stage=spec.stage if stage is None else stage, nproc=nproc or spec.nproc,
                               workload=dataclasses.replace(spec.workload, **workload))
    return dataclasses.replace(job, spec=spec, config=new_config)


def changes(job, device: str, stage_flag: str = "--stage"):
    """(the flag, the changed job) for each change that lowers a rank's peak, cheapest first: a higher
    stage costs communication alone; gradient checkpointing one more forward; offload (on CUDA, where
    the GPU's memory is the limit) the host's bandwidth and Adam; a smaller micro-batch changes the
    workload; fewer ranks on a CPU host (which its ranks share) changes the comparison."""
    spec, zero = job.spec, job.config["zero_optimization"]
    for stage in range(spec.stage + 1, 4):
        yield f"{stage_flag} {stage}", changed(job, stage=stage)
    if not spec.workload.gradient_checkpointing:
        yield "--gradient-checkpointing", changed(job, gradient_checkpointing=True)
    offloaded = {name: (zero.get(f"offload_{name}") or {}).get("device", "none") == "cpu" for name in ("optimizer", "param")}
    if device == "cuda" and spec.stage >= 1 and not offloaded["optimizer"]:
        yield "--offload optimizer", changed(job, config={"offload_optimizer": {"device": "cpu"}}, offload="optimizer")
    if device == "cuda" and spec.stage == 3 and not offloaded["param"]:
        yield "--offload param", changed(job, config={"offload_optimizer": {"device": "cpu"},
                                                      "offload_param": {"device": "cpu"}}, offload="param")
    batch = int(job.config["train_micro_batch_size_per_gpu"])
    while batch > 1:
        batch //= 2
        yield f"--batch-size {batch}", changed(job, config={"train_micro_batch_size_per_gpu": batch}, batch_size=batch)
    if device != "cuda" and not spec.multi_node.enabled:
        for nproc in range(spec.nproc - 1, 0, -1):
            yield f"--gpus {nproc}", changed(job, nproc=nproc)


def cheapest_fit(job, device: str, offered: int, stage_flag: str = "--stage") -> str | None:
    """The first of `changes` whose predicted peak fits in `offered` (within it, not merely within the
    tight band), with its figures; None if none does."""
    for flag, candidate in changes(job, device, stage_flag):
        peak, ranks = needed_per_rank(candidate, device), ranks_sharing_a_memory(candidate, device)
        if peak is not None and peak * ranks <= offered:
            needed = f"{ranks} ranks x {size_text(peak)} = {size_text(ranks * peak)}" if ranks > 1 else size_text(peak)
            return f"{flag} ({needed} predicted)"
    return None


def refusals(jobs: list, device: str, device_memory_gb: float | None, force: bool,
             stage_flag: str = "--stage") -> list[tuple[object, str, str]]:
    """Phase 3: warn of tight jobs (and, with force, of those that will not fit); (job, its line, its
    fix) for each job refused."""
    offered, offered_name = offered_memory(device, device_memory_gb)  # asked once: on CUDA a child process asks
    refused = []
    for job, verdict, line in verdicts(jobs, device, offered, offered_name):
        if verdict is Fit.TIGHT:
            print(f"warning: {line} (within {TIGHT_FRACTION:.0%} of the limit)", file=sys.stderr)
        elif verdict is Fit.WILL_NOT_FIT and force:
            print(f"warning: {line}; going on (--force)", file=sys.stderr)
        elif verdict is Fit.WILL_NOT_FIT:
            cheapest = cheapest_fit(job, device, offered, stage_flag)
            fix = (f"the cheapest change that fits: {cheapest}; other ways to lower a rank's memory: {KNOBS}"
                   if cheapest else f"no one change fits: combine some of {KNOBS}")
            refused.append((job, line, f"{fix}; or pass --force to run anyway"))
    return refused


def refuse(refused: list[tuple[object, str, str]]) -> None:
    """Stop the command: an `error:` line per refused job, the last as the BadInput (exit 2)."""
    for _, line, fix in refused[:-1]:
        print(f"error: {line}; {fix}", file=sys.stderr)
    raise BadInput(refused[-1][1], refused[-1][2])


def check(jobs: list, device: str, device_memory_gb: float | None, force: bool) -> None:
    """Phase 3 for `run`: BadInput (exit 2) when a job will not fit, unless force."""
    refused = refusals(jobs, device, device_memory_gb, force)
    if refused:
        refuse(refused)


def admit(jobs: list, device: str, device_memory_gb: float | None, force: bool) -> tuple[list, list[dict]]:
    """Phase 3 for `compare`: (the jobs that go ahead, a `refused` row for each of the others, said on
    stderr with its fix); BadInput as `check` when none goes ahead."""
    refused = refusals(jobs, device, device_memory_gb, force, stage_flag="--stages")
    if refused and len(refused) == len(jobs):
        refuse(refused)
    rows = []
    for job, line, fix in refused:
        print(f"note: {line}: not run (refused); {fix}", file=sys.stderr)
        spec = job.spec
        world_size = spec.multi_node.world_size(spec.nproc) or spec.nproc
        rows.append(not_run_summary(world_size, spec.stage, spec.impl, f"refused: {line.split(': ', 1)[1]}", "refused"))
    refused_jobs = {id(job) for job, _, _ in refused}
    return [job for job in jobs if id(job) not in refused_jobs], rows
