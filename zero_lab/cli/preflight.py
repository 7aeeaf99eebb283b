"""Before anything launches: will each run fit in the memory the device offers?

Phase 1: `offered_memory`: what the device offers - `--device-memory GB` when given (per GPU on
         CUDA, the host's on CPU), else the least free memory among the visible GPUs
         (`free_gpu_bytes`: `torch.cuda.mem_get_info`, asked in a child process), or on CPU the
         host's available memory under the tightest of the machine and its container
         (zero_lab.launch.memory_watch).
Phase 2: `predicted_peak`: each job's predicted peak per rank, the estimate its report will carry
         (`peak_memory.predict_run_peak`, from the same `[model]` and `[zero]` fields the harness
         will log, offload included): on CUDA the device's bytes alone (what offload moved to the
         host is not the GPU's), on CPU every byte; None where there is none (an unreadable
         architecture, a user's script).
Phase 3: `check`: the verdict per job (analysis.memory.memory_fit); a tight one is a warning, one that
         will not fit stops the command with exit 2 and the knobs that would help, unless --force.
"""

from __future__ import annotations

import json
import subprocess
import sys

from zero_lab.analysis.memory.memory_fit import KNOBS, TIGHT_FRACTION, Fit, fit, fit_line
from zero_lab.cli.errors import BadInput
from zero_lab.nano.dtypes import PRECISION_OF_DTYPE_NAME
from zero_lab.workload.log_lines import MB as MIB, size_text

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


def predicted_peak(job) -> int | None:
    """Phase 2: one rank's predicted peak for a prepared job (zero_lab.cli.jobs.Job)."""
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
             "gradient_checkpointing": spec.workload.gradient_checkpointing}
    sections = settings.zero_optimization
    zero = {"impl": spec.impl, "reduce_bucket_size": sections.reduce_bucket_size,
            "communication_data_type": settings.communication_data_type or "auto",
            "gradient_accumulation_steps": int(job.config.get("gradient_accumulation_steps") or 1),
            "offload_optimizer": sections.offload_optimizer.device, "offload_param": sections.offload_param.device}
    prediction = predict_run_peak(model, zero, spec.stage, PRECISION_OF_DTYPE_NAME[spec.workload.dtype], world_size)
    return prediction.peak_seen_on(spec.device) if prediction is not None else None


def verdicts(jobs: list, device: str, device_memory_gb: float | None) -> list[tuple[object, Fit, str | None]]:
    """(job, verdict, the line with its figures, None without a verdict) for every job."""
    offered, offered_name = offered_memory(device, device_memory_gb)
    found = []
    for job in jobs:
        peak = predicted_peak(job)
        ranks = 1 if device == "cuda" else job.spec.nproc  # a GPU each, or one host for the node's ranks
        verdict = fit(peak * ranks if peak is not None else None, offered)
        judged = verdict is not Fit.NO_VERDICT
        line = fit_line(job.label, peak, ranks, offered, offered_name, verdict) if judged else None
        found.append((job, verdict, line))
    return found


def add_row_verdicts(rows: list[dict], device: str, device_memory_gb: float | None, offload: str) -> str:
    """`estimate`: each row's `fit` (a Fit's value) for its predicted peak; returns what was offered, in words."""
    offered, offered_name = offered_memory(device, device_memory_gb)
    for row in rows:
        peak = row.get("predicted_peak_mb")
        ranks = 1 if device == "cuda" else row["world_size"]
        judged = peak is not None and not (device == "cuda" and offload != "none")
        row["fit"] = fit(peak * MIB * ranks if judged else None, offered).value
    return f"{size_text(offered)} ({offered_name})" if offered is not None else offered_name


def check(jobs: list, device: str, device_memory_gb: float | None, force: bool) -> None:
    """Phase 3: warn of tight jobs; BadInput (exit 2) when one will not fit, unless force."""
    refused = []
    for _, verdict, line in verdicts(jobs, device, device_memory_gb):
        if verdict is Fit.TIGHT:
            print(f"warning: {line} (within {TIGHT_FRACTION:.0%} of the limit)", file=sys.stderr)
        elif verdict is Fit.WILL_NOT_FIT and force:
            print(f"warning: {line}; going on (--force)", file=sys.stderr)
        elif verdict is Fit.WILL_NOT_FIT:
            refused.append(line)
    if refused:
        for line in refused[:-1]:
            print(f"error: {line}", file=sys.stderr)
        raise BadInput(refused[-1], f"lower the memory a rank needs with {KNOBS}; or pass --force to run anyway")
