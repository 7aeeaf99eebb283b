"""Build the torchrun command and environment for one run: pure functions, no process started.

On CPU, `--gpus N` means N processes, each given `cores // N` threads; on CUDA it means N devices.
Single-node runs rendezvous on 127.0.0.1 port 0: torchrun's agent binds its store to a port the OS
gives it in the same call, and the ranks join that store (a port probed free and bound later can be
taken in between by a comparison or a test running beside it); multi-node runs pass `--nnodes`,
`--node-rank`, `--rdzv-*` to torchrun.
"""

from __future__ import annotations

import ctypes
import os
import shlex
import signal
import sys
from dataclasses import dataclass, field
from pathlib import Path

# The harness entry inside the package (an installed zero-lab has it too); the checkout's
# harness/train.py runs the same main.
TRAIN_SCRIPT = Path(__file__).resolve().parents[1] / "harness" / "train.py"
CONFIG_DIR = TRAIN_SCRIPT.parent / "configs"


@dataclass
class Workload:
    """What the harness trains; the same for every impl of a comparison."""

    model: str = "tiny"
    steps: int = 10
    batch_size: int | None = None
    seq_len: int | None = None
    dtype: str = "float32"
    seed: int = 42
    dataset_path: str | None = None
    offload: str = "none"  # none, optimizer or param: the harness's --offload
    save_dir: str | None = None  # the harness's --save-dir (checkpoints)
    save_every: int = 0
    resume: str | None = None  # the harness's --resume TAG ("latest": the tag `latest` names)
    ranks_per_node: int | None = None  # the harness's --ranks-per-node K (None: the launcher's)
    attn_impl: str | None = None  # the harness's --attn-impl (None: Hugging Face's choice, sdpa where it runs)
    gradient_checkpointing: bool = False  # the harness's --gradient-checkpointing
    global_batch_size: int | None = None  # the harness's --global-batch-size N (an elastic range keeps it)
    optimizer: str | None = None  # the harness's --optimizer adamw|muon (None: the config's)
    trace_steps: str | None = None  # --trace: the steps each rank traces (None: no trace; workload.tracing.trace_settings)
    peak_tflops: float | None = None  # --peak-tflops: the device's peak for MFU in the summary (None: the table's); not the harness's
    check_collectives: bool = False  # --check-collectives: torch checks every collective across ranks before issuing it


@dataclass
class MultiNode:
    """torchrun's multi-node flags, passed through unchanged (None: single node)."""

    nnodes: str | None = None
    node_rank: int | None = None
    rdzv_endpoint: str | None = None
    rdzv_id: str | None = None

    @property
    def enabled(self) -> bool:
        return self.nnodes not in (None, "1") or self.rdzv_endpoint is not None

    def world_size(self, nproc: int) -> int | None:
        """Ranks in all: processes per node times nodes; None for an elastic range ("1:4")."""
        nodes = self.nnodes or "1"
        return nproc * int(nodes) if nodes.isdigit() else None


@dataclass
class UserScript:
    """A user's own DeepSpeed training script and its arguments; zero-lab appends
    `--deepspeed_config PATH`, DeepSpeed's own contract, and the script runs as written."""

    path: Path
    arguments: list[str] = field(default_factory=list)


@dataclass
class LaunchSpec:
    """One torchrun invocation: who trains what, where, and where its logs go."""

    impl: str
    stage: int
    nproc: int
    device: str
    config_path: Path
    workload: Workload
    log_dir: Path
    port: int = 0  # single node: the agent's store port (0: the OS picks one as the agent binds it)
    multi_node: MultiNode = field(default_factory=MultiNode)
    extra_torchrun_args: list[str] = field(default_factory=list)
    python: str = sys.executable
    stall_timeout_s: float = 0.0  # the CLI stops the run after this long without a step (0: never)
    host_memory_limit: int | None = None  # bytes the ranks may hold on this host (--device-memory on CPU)
    script: UserScript | None = None  # a user's training script instead of the harness (compare --script)
    max_restarts: int = 0  # torchrun --max-restarts: restarts of every worker when one dies (docs/restarts.md)
    engine_path: Path | None = None  # an own engine's file or package (--impl NAME=PATH); None: a built-in impl



def threads_per_process(cores: int, nproc: int) -> int:
    return max(1, cores // nproc)


def torchrun_command(spec: LaunchSpec) -> list[str]:
    """The exact argv: `python -m torch.distributed.run <launcher flags> harness/train.py <flags>`."""
    command = [spec.python, "-m", "torch.distributed.run", "--nproc-per-node", str(spec.nproc)]
    if spec.multi_node.enabled:
        node = spec.multi_node
        command += ["--nnodes", node.nnodes or "1", "--rdzv-backend", "c10d"]
        command += [f"--{flag}={value}" for flag, value in (
            ("node-rank", node.node_rank),
            ("rdzv-endpoint", node.rdzv_endpoint),
            ("rdzv-id", node.rdzv_id),
        ) if value is not None]
    else:
        command += single_node_rendezvous(spec.port)
    command += ["--max-restarts", str(spec.max_restarts)] if spec.max_restarts else []
    # Every rank's stdout and stderr go to files; rank 0's stdout is also shown (for progress).
    command += ["--log-dir", str(spec.log_dir), "--redirects", "3", "--tee", "1"]
    command += ["--local-ranks-filter", "0", *spec.extra_torchrun_args]
    if spec.script is not None:
        return command + [str(spec.script.path), *spec.script.arguments, "--deepspeed_config", str(engine_config_path(spec))]
    command += [str(TRAIN_SCRIPT), *train_arguments(spec)]
    return command


def single_node_rendezvous(port: int) -> list[str]:
    """A job on one node: torchrun's c10d rendezvous on 127.0.0.1:port, bound once by the agent, which
    every attempt of a restartable job joins again (the static one of `--master-port` would need a port
    picked in advance, and is made once, for the first attempt)."""
    return ["--nnodes", "1", "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}"]


def agent_store_environment(spec: LaunchSpec) -> dict[str, str]:
    """On one node, or with --max-restarts, the ranks share the agent's store (torch's default, said here
    so a caller's environment cannot turn it off): it is bound once, by the agent, while a store of the
    ranks' own would need a port picked free and bound seconds later, which another process can take in
    between. The harness keeps each attempt's keys apart in it (`workload.faults.restart_hooks.join_attempt_group`)."""
    shared = spec.max_restarts or not spec.multi_node.enabled
    return {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "0"} if shared else {}


def engine_config_path(spec: LaunchSpec) -> Path:
    """The config file the engine itself reads: nano's (`config.json`), or for official DeepSpeed its
    conversion (`config.official.json`, beside it); the harness converts for itself, a script cannot."""
    return spec.config_path.with_name("config.official.json") if spec.impl == "official" else spec.config_path


def process_group_timeout_s(stall_timeout_s: float) -> float | None:
    """The harness's process-group timeout for a stall timeout (None: the harness's default).

    Longer by a minute, so that the CLI, which sees every rank, reports a stall first; a rank
    still gives up on a collective by itself where no CLI watches (a hand-made launch, a node
    whose CLI was killed)."""
    return stall_timeout_s + 60 if stall_timeout_s > 0 else None


def watched_stall_timeout_s(spec: LaunchSpec) -> float:
    """The stall timeout the CLI enforces itself (0: none). Only global rank 0 prints `[opt_step]`,
    and on several nodes which node holds it is settled at rendezvous, so there the harness's
    process-group timeout alone ends a hung collective."""
    return 0.0 if spec.multi_node.enabled else spec.stall_timeout_s


def train_arguments(spec: LaunchSpec) -> list[str]:
    """harness/train.py's own flags (the seed's names)."""
    arguments = [
        "--impl", impl_argument(spec),
        "--deepspeed_config", str(spec.config_path),
        "--zero-stage", str(spec.stage),
        "--device", spec.device,
        *workload_arguments(spec.workload),
    ]
    timeout_s = process_group_timeout_s(spec.stall_timeout_s)
    return arguments + (["--dist-timeout", f"{timeout_s:g}"] if timeout_s is not None else [])


def impl_argument(spec: LaunchSpec) -> str:
    """The harness's --impl: the impl's name, or NAME=PATH for an own engine (its path absolute)."""
    return spec.impl if spec.engine_path is None else f"{spec.impl}={Path(spec.engine_path).resolve()}"


def workload_arguments(work: Workload) -> list[str]:
    """The harness flags that say what it trains, the same for every run of a comparison."""
    arguments = [
        "--model-name", work.model,
        "--model-dtype", work.dtype,
        "--steps", str(work.steps),
        "--seed", str(work.seed),
    ]
    optional = (("--batch-size", work.batch_size), ("--seq-len", work.seq_len), ("--dataset-path", work.dataset_path),
                ("--offload", None if work.offload == "none" else work.offload), ("--save-dir", work.save_dir),
                ("--save-every", work.save_every or None), ("--resume", work.resume),
                ("--ranks-per-node", work.ranks_per_node), ("--attn-impl", work.attn_impl),
                ("--global-batch-size", work.global_batch_size))
    for flag, value in optional:
        if value is not None:
            arguments += [flag, str(value)]
    arguments += ["--optimizer", work.optimizer] if work.optimizer else []
    return arguments + (["--gradient-checkpointing"] if work.gradient_checkpointing else [])


def launch_environment(base: dict[str, str], device: str, nproc: int, cores: int) -> dict[str, str]:
    """The child environment: thread count on CPU, and DeepSpeed told which accelerator it has, on
    every device (torchrun passes it to every rank): a `DS_ACCELERATOR=cpu` left in the CLI's
    environment must not put a CUDA run on DeepSpeed's CPU accelerator."""
    env = dict(base)
    env["DS_ACCELERATOR"] = "cpu" if device == "cpu" else "cuda"
    if device == "cpu":
        env["OMP_NUM_THREADS"] = str(threads_per_process(cores, nproc))
        env.setdefault("LOCAL_SIZE", str(nproc))
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


# Linux's prctl(2) option that sends this process a signal when the thread that forked it ends.
PR_SET_PDEATHSIG = 1
# Looked up in the parent, once (a child between fork and exec should not load libraries), among
# the symbols the running Python already has: libc's prctl.
_PRCTL = getattr(ctypes.CDLL(None, use_errno=True), "prctl", None) if sys.platform.startswith("linux") else None


def child_dies_with_parent() -> None:
    """Popen's preexec_fn for torchrun: SIGTERM reaches it when the CLI dies, however the CLI dies.

    torchrun runs in a session of its own (so a terminal's Ctrl-C reaches the CLI alone), which
    also hides it from a signal to the CLI's process group: a SIGKILLed CLI (an OOM killer, a CI
    runner's hard kill, gpu-check's budget) would leave torchrun and its ranks training on, holding
    the GPU. With the parent-death signal the kernel sends torchrun SIGTERM instead, and torchrun
    stops its ranks as it does on any SIGTERM. Linux only; elsewhere nothing changes. The signal
    follows the forking thread: the CLI starts torchrun from its main thread, which lives as long
    as the CLI does."""
    if _PRCTL is None:
        return
    _PRCTL(PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
    if os.getppid() == 1:  # the CLI died before the line above: nobody would send the signal
        os.kill(os.getpid(), signal.SIGTERM)


def shell_quote(command: list[str]) -> str:
    return " ".join(shlex.quote(part) for part in command)
