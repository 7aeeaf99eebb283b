"""Benchmark: the doctor against run directories whose cause is known, and its confusion table.

    .venv/bin/python bench/doctor_corpus.py                       # every case, into runs/doctor-corpus
    .venv/bin/python bench/doctor_corpus.py --only killed-rank,stall --markdown

`zero-lab doctor` answers "why did my run do that" from a run's files. This bench makes runs whose
answer is known, with the commands a user types (`zero-lab run`, `compare`, `compare --script`), and
plants the faults the way they happen: a rank killed from outside, the launcher's agent killed, a
memory limit, a module one rank skips, a rank that stops, configs that differ in the learning rate,
the weight decay or the dtype, a Hugging Face Trainer saving at stage 3 without the 16-bit gather,
a `zero-lab run` itself killed, a script that raises.

Phase 1: each case makes its run directories (a fault's moment is a named one: a rank paused after
         a step, `workload.faults.rank_pause`, is what the bench kills or leaves).
Phase 2: `zero-lab doctor --format json` on them: the codes of the errors and warnings found, in the
         doctor's order, the exit code, and whether anything printed a traceback.
Phase 3: the table, per case: what was expected and what was found. A healthy case is right with no
         error and no warning (its cells are counted); a fault case when the first error or warning
         is the expected cause (and, where a case says so, the finding's cause names it).
Goal (issue 48): no warning or error on at least 30 healthy cells, the right cause first on every
fault, no traceback on any input. Exit code 1 when the goal is missed.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from zero_lab.analysis.diagnosis.finding import SEVERITY_OF  # noqa: E402
from zero_lab.workload.faults.rank_pause import PAUSE_VARIABLE  # noqa: E402

ZERO_LAB = str(Path(sys.executable).with_name("zero-lab"))
CPU = ["--gpus", "2", "--device", "cpu"]
TINY = [*CPU, "--model", "tiny", "--steps", "4"]
CONFIGS = REPO / "zero_lab" / "harness" / "configs"
SKIPPING_CONFIG = REPO / "docs" / "learn" / "configs" / "zero3-every-module-gathered.json"  # every module gathered
RAISES = '''"""A training script that raises after joining its process group (the doctor's corpus)."""
import torch.distributed as dist
dist.init_process_group("gloo")
raise ValueError("the data loader found no files under data/")
'''
PAUSED = "[rank {rank} paused at {moment}] pid="
STALL_SECONDS = "20"


@dataclass
class Case:
    """One cause: the directories it makes, what the doctor should find first (None: nothing, a
    healthy case), and words the finding's cause must hold."""

    name: str
    expected: str | None
    make: object  # (out: Path) -> list[Path], the directories to diagnose
    cause_says: str = ""
    directories: list[Path] = field(default_factory=list)


def zero_lab(*arguments: str, env: dict | None = None, limit_bytes: int | None = None) -> subprocess.CompletedProcess:
    """A zero-lab command as a user types it (limit_bytes: an address-space limit on it and its ranks)."""
    limit = (lambda: resource.setrlimit(resource.RLIMIT_AS, (limit_bytes, limit_bytes))) if limit_bytes else None
    return subprocess.run([ZERO_LAB, *arguments], capture_output=True, text=True, cwd=REPO, timeout=1800,
                          env={**os.environ, **(env or {})}, preexec_fn=limit)


def config_file(out: Path, name: str, stage: int, change) -> Path:
    config = json.loads((CONFIGS / f"zero{stage}.json").read_text())
    change(config)
    path = out / f"{name}.json"
    path.write_text(json.dumps(config))
    return path


def compare(out: Path, name: str, *arguments: str) -> list[Path]:
    zero_lab("compare", "--out", str(out), "--name", name, *arguments)  # before a script's own arguments (after --)
    return [out / name]


def run(out: Path, name: str, *arguments: str) -> Path:
    zero_lab("run", *arguments, "--out", str(out), "--name", name)
    return out / name


def paused_pid(run_dir: Path, rank: int, moment: str, cli: subprocess.Popen, timeout_s: float = 600) -> int:
    """The pid of the rank that paused at the named moment (torchrun's per-attempt logs say it)."""
    words = PAUSED.format(rank=rank, moment=moment)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and cli.poll() is None:
        for log in sorted((run_dir / "torchrun-logs").rglob("stdout.log")):
            for line in log.read_text(errors="replace").splitlines():
                if words in line:
                    return int(line.split("pid=")[1].split()[0])
        time.sleep(0.2)
    raise RuntimeError(f"rank {rank} never paused at {moment} in {run_dir}")


def with_a_pause(out: Path, name: str, act, *arguments: str) -> list[Path]:
    """`zero-lab run` of nano at stage 2 whose rank 1 pauses after step 2; `act(cli, pid)` plants the fault."""
    run_dir = out / name
    cli = subprocess.Popen([ZERO_LAB, "run", "--impl", "nano", "--stage", "2", *TINY, *arguments, "--out", str(out),
                            "--name", name], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO,
                           env={**os.environ, PAUSE_VARIABLE: "1:step-2"})
    pid = paused_pid(run_dir, 1, "step-2", cli)
    act(cli, pid)
    cli.communicate(timeout=900)
    return [run_dir]


def kill_the_rank(cli, pid):
    os.kill(pid, signal.SIGKILL)


def kill_the_agent(cli, pid):
    """torchrun's agent killed: its ranks are left running, and the launcher must stop them."""
    import psutil

    agent = next(child for child in psutil.Process(cli.pid).children(recursive=True)
                 if "torch.distributed.run" in " ".join(child.cmdline()))
    agent.kill()


def kill_the_cli(cli, pid):
    import psutil

    ranks = psutil.Process(cli.pid).children(recursive=True)
    cli.kill()
    cli.wait()
    for process in ranks:  # what the killed CLI would have stopped: the machine's, not the corpus's
        try:
            process.kill()
        except psutil.NoSuchProcess:
            pass


def gathered(config: dict) -> None:
    config["zero_optimization"]["stage3_gather_16bit_weights_on_model_save"] = True


def healthy_cases() -> list[Case]:
    return [
        Case("fp32 stages 0-3, nano and official", None, lambda out: compare(
            out, "fp32", "--impls", "nano,official", "--stages", "0,1,2,3", *TINY)),
        Case("fp32 stages 2-3, fsdp2", None, lambda out: compare(out, "fsdp2", "--impls", "fsdp2", "--stages", "2,3",
                                                                 *TINY)),
        Case("bf16 stages 1-3, nano", None, lambda out: compare(
            out, "bf16", "--impls", "nano", "--stages", "1,2,3", "--dtype", "bfloat16", *TINY)),
        Case("bf16 stages 2-3, fsdp2", None, lambda out: compare(
            out, "bf16-fsdp2", "--impls", "fsdp2", "--stages", "2,3", "--dtype", "bfloat16", *TINY)),
        Case("fp16 stages 1-3, nano", None, lambda out: compare(
            out, "fp16", "--impls", "nano", "--stages", "1,2,3", "--dtype", "float16", *TINY)),
        Case("offload stages 2-3, nano and official", None, lambda out: compare(
            out, "offload", "--impls", "nano,official", "--stages", "2,3", "--offload", "optimizer", *TINY)),
        Case("Muon stages 1-3, nano and official", None, lambda out: compare(
            out, "muon", "--impls", "nano,official", "--stages", "1,2,3", "--optimizer", "muon", *TINY)),
        Case("Trainer script, stage 2, nano and official", None, lambda out: compare(
            out, "trainer", "--script", str(REPO / "examples" / "hf_trainer.py"), *CPU, "--stages", "2",
            "--", "--max-steps", "4")),
        Case("traced stage 3, nano", None, lambda out: compare(
            out, "traced", "--impls", "nano", "--stages", "3", "--trace-steps", "2-3", *TINY)),
        Case("checkpoints every 2 steps, stage 3, nano and official", None, lambda out: [
            run(out, f"saved-{impl}", "--impl", impl, "--stage", "3", *TINY, "--save-dir", str(out / f"ckpt-{impl}"),
                "--save-every", "2", "--config", str(config_file(out, "gathered", 3, gathered)))
            for impl in ("nano", "official")]),
    ]


def fault_cases() -> list[Case]:
    def learning_rate(config):
        config["scheduler"]["params"]["warmup_max_lr"] = 2e-3

    def decay(weight_decay: float):
        """A constant learning rate of 1e-2 (no warm-up), so that a weight decay moves the weights within 4 steps."""
        def change(config):
            config.pop("scheduler")
            config["optimizer"]["params"].update(lr=1e-2, weight_decay=weight_decay)
        return change

    def diverged(out: Path, name: str, *arguments: str, reference: tuple[str, ...] = ()) -> list[Path]:
        return [run(out, f"{name}-reference", "--impl", "nano", "--stage", "2", *TINY, *reference),
                run(out, name, "--impl", "nano", "--stage", "2", *TINY, *arguments)]

    def raises(out: Path) -> list[Path]:
        script = out / "raises.py"
        script.write_text(RAISES)
        return compare(out, "raises", "--script", str(script), "--impls", "nano", "--stages", "2", *CPU)

    def skipped(out: Path) -> list[Path]:
        config = SKIPPING_CONFIG
        return compare(out, "skipped", "--script", str(REPO / "examples" / "skipping_script.py"),
                       "--impls", "nano", "--stages", "3", *CPU, "--config", str(config), "--", "--steps", "3")

    return [
        Case("a rank killed from outside", "rank-killed", lambda out: with_a_pause(out, "killed-rank", kill_the_rank)),
        Case("the launcher's agent killed", "rank-killed", lambda out: with_a_pause(out, "killed-agent", kill_the_agent)),
        Case("out of memory (an address-space limit)", "out-of-memory", lambda out: [oom(out)]),
        Case("a module one rank skips (stage 3)", "collective-mismatch", skipped),
        Case("a rank that stops (a stall)", "run-failed", lambda out: with_a_pause(
            out, "stall", lambda cli, pid: None, "--stall-timeout", STALL_SECONDS)),
        Case("another learning rate", "loss-divergence", lambda out: diverged(
            out, "lr", "--config", str(config_file(out, "lr", 2, learning_rate))), cause_says="learning rate"),
        Case("another weight decay", "loss-divergence", lambda out: diverged(
            out, "decay", "--config", str(config_file(out, "decayed", 2, decay(1.0))),
            reference=("--config", str(config_file(out, "undecayed", 2, decay(0.0))))),
             cause_says="optimizer.params.weight_decay"),
        # bf16 against fp32: within bf16's tolerance (5e-2) the losses agree; the doctor tells the dtypes apart
        Case("another dtype", "dtype-difference", lambda out: diverged(out, "dtype", "--dtype", "bfloat16")),
        Case("a Trainer save at stage 3 without the 16-bit gather", "no-16bit-weights-on-save", lambda out: compare(
            out, "trainer-save", "--script", str(REPO / "examples" / "hf_trainer.py"), *CPU, "--stages", "3",
            "--impls", "nano", "--", "--max-steps", "2", "--save-steps", "2")),
        Case("zero-lab run itself killed", "run-failed", lambda out: with_a_pause(out, "killed-cli", kill_the_cli)),
        Case("a script that raises", "run-failed", raises),
    ]


def oom(out: Path) -> Path:
    """tiny at stage 0 with a batch far beyond a 5 GB address space per process: an allocation is refused."""
    zero_lab("run", "--impl", "nano", "--stage", "0", *CPU, "--model", "tiny", "--batch-size", "64", "--seq-len",
             "2048", "--steps", "2", "--force", "--out", str(out), "--name", "oom", limit_bytes=5 * 2**30)
    return out / "oom"


def cells(directory: Path) -> int:
    """The runs a directory holds: a compare's cells, or one run."""
    found = list((directory / "cells").glob("*/summary.json"))
    return len(found) if found else 1


def diagnose(case: Case) -> dict:
    """Phase 2."""
    done = subprocess.run([ZERO_LAB, "doctor", *map(str, case.directories), "--format", "json"], capture_output=True,
                          text=True, cwd=REPO, timeout=600)
    traceback = "Traceback" in done.stderr  # the doctor's own (a finding may quote a run's)
    try:
        findings = json.loads(done.stdout)["findings"]
    except (ValueError, KeyError):
        findings = []
    serious = [finding for finding in findings if finding["severity"] in ("error", "warning")]
    if case.expected is None:
        right = not serious
    elif SEVERITY_OF[case.expected] == "info":  # a fact the doctor must tell, and nothing worse
        right = not serious and case.expected in [finding["code"] for finding in findings]
        serious = [finding for finding in findings if finding["code"] == case.expected]
    else:
        right = bool(serious) and serious[0]["code"] == case.expected and case.cause_says in serious[0]["cause"]
    return {"case": case.name, "expected": case.expected or "no error or warning",
            "found": ", ".join(finding["code"] for finding in serious) or "none",
            "cells": sum(cells(directory) for directory in case.directories), "healthy": case.expected is None,
            "right": right and not traceback and done.returncode in (0, 1), "traceback": traceback,
            "exit_code": done.returncode}


def table(rows: list[dict]) -> str:
    """Phase 3, in markdown."""
    lines = ["| case | runs | expected | found (errors and warnings, the first first) | right |", "|---|---|---|---|---|"]
    lines += [f"| {row['case']} | {row['cells']} | {row['expected']} | {row['found']} | {'yes' if row['right'] else 'NO'} |"
              for row in rows]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=REPO / "runs" / "doctor-corpus")
    parser.add_argument("--only", default="", help="cases whose name contains one of these words, comma-separated")
    parser.add_argument("--markdown", action="store_true", help="print the table in markdown (docs/doctor.md)")
    args = parser.parse_args()
    wanted = [word.strip() for word in args.only.split(",") if word.strip()]
    cases = [case for case in healthy_cases() + fault_cases() if not wanted or any(word in case.name for word in wanted)]
    rows = []
    for case in cases:  # Phase 1, then 2
        out = args.out / case.name.replace(" ", "-").replace(",", "").replace("'", "")
        out.mkdir(parents=True, exist_ok=True)
        started = time.monotonic()
        case.directories = case.make(out)
        rows.append(diagnose(case))
        print(f"{case.name}: {rows[-1]['found']} ({'right' if rows[-1]['right'] else 'WRONG'}, "
              f"{time.monotonic() - started:.0f} s)", file=sys.stderr, flush=True)
    print(table(rows) if args.markdown else json.dumps(rows, indent=1))
    healthy = sum(row["cells"] for row in rows if row["healthy"] and row["right"])
    missed = [row["case"] for row in rows if not row["right"]]
    print(f"healthy runs with no error or warning: {healthy}; faults with the right cause first: "
          f"{sum(1 for row in rows if not row['healthy'] and row['right'])} of "
          f"{sum(1 for row in rows if not row['healthy'])}; tracebacks: {sum(row['traceback'] for row in rows)}",
          file=sys.stderr)
    return 1 if missed or (not wanted and healthy < 30) else 0


if __name__ == "__main__":
    sys.exit(main())
