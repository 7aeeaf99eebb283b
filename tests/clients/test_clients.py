"""The HF Trainer and accelerate on nano (through the drop-in, no user-side patching) beside official
DeepSpeed, run the same way in the same test: a tiny Llama, 3 optimizer steps, 1 and 2 ranks.

Per world size, three torchruns of `client_cases.py`: official; nano, whose launch then resumes
official's Trainer checkpoints; official resuming nano's. Targets: fp32 losses within 1e-6
of official's, bf16 within bf16 rounding; save_model() weights within 1e-6 (bf16: one rounding);
a resumed step equal to the uninterrupted run's, in both directions.
"""

import json

import pytest
import torch
from safetensors.torch import load_file

from tests.clients import client_cases
from tests.clients.dropin import DROPIN, run_torchrun

pytestmark = [pytest.mark.official, pytest.mark.slow]

SCRIPT = DROPIN.parents[1] / "tests" / "clients" / "client_cases.py"
TRAINER = list(client_cases.TRAINER_CASES)
ACCELERATE = ["accelerate-config-optimizer", "accelerate-adamw"]
FP32, BF16_RELATIVE = 1e-6, 2.0 ** -8


def _run(impl, world_size, out, cases, resume_from=None, resumed_out=None):
    args = ["--out", str(out), "--cases", ",".join(cases)] + (["--resume-from", str(resume_from)] if resume_from else [])
    args += ["--resumed-out", str(resumed_out)] if resumed_out else []
    completed = run_torchrun(impl, world_size, SCRIPT, args)
    assert completed.returncode == 0, f"{impl}: {completed.stderr[-4000:]}"
    assert ("[engine] deepspeed=nano" in completed.stdout) == (impl == "nano")


def _losses(root, case, rank):
    return json.loads((root / case / f"rank{rank}.json").read_text())["losses"]


def _weights(root, case):
    if case.startswith("accelerate"):
        return torch.load(root / case / "state_dict.pt")
    return load_file(root / case / "model" / "model.safetensors")


def _delta(first: dict, second: dict) -> float:
    assert set(first) == set(second), set(first) ^ set(second)
    return max((first[key].float() - second[key].float()).abs().max().item() for key in first)


@pytest.mark.parametrize("world_size", [1, 2])
def test_trainer_and_accelerate_train_save_and_resume_on_nano_as_on_official(world_size, tmp_path):
    runs = {name: tmp_path / name for name in ("official", "nano", "nano_from_official", "official_from_nano")}
    _run("official", world_size, runs["official"], TRAINER + ACCELERATE)
    _run("nano", world_size, runs["nano"], TRAINER + ACCELERATE, resume_from=runs["official"],
         resumed_out=runs["nano_from_official"])
    _run("official", world_size, runs["official_from_nano"], TRAINER, resume_from=runs["nano"])
    failures, table = [], {}
    for case in TRAINER + ACCELERATE:
        bf16 = case.endswith("bf16")
        row = table[case] = {}
        for rank in range(world_size):
            nano, official = _losses(runs["nano"], case, rank), _losses(runs["official"], case, rank)
            assert len(nano) == len(official) > 0
            worst = max(abs(a - b) for a, b in zip(nano, official))
            allowed = BF16_RELATIVE * max(map(abs, official)) if bf16 else FP32
            row["loss_delta"] = max(row.get("loss_delta", 0.0), worst)
            if worst > allowed:
                failures.append(f"W={world_size} {case} rank {rank}: losses differ by {worst:.3g} (> {allowed:.3g})")
            if case in TRAINER:  # a resumed run trains the last step only: its losses end the fresh run's
                for resumed, fresh in (("nano_from_official", "nano"), ("official_from_nano", "official")):
                    tail = _losses(runs[resumed], case, rank)
                    gap = max(abs(a - b) for a, b in zip(tail, _losses(runs[fresh], case, rank)[-len(tail):]))
                    row[resumed] = max(row.get(resumed, 0.0), gap)
                    if not tail or gap > (allowed if bf16 else FP32):
                        failures.append(f"W={world_size} {case} rank {rank}: {resumed} resumes {gap:.3g} off")
        weights = _delta(_weights(runs["nano"], case), _weights(runs["official"], case))
        row["weights_delta"] = weights
        if weights > (2.0 ** -7 if bf16 else FP32):
            failures.append(f"W={world_size} {case}: saved weights differ by {weights:.3g}")
        print(f"[clients] W={world_size} {case} " + " ".join(f"{key}={value:.3g}" for key, value in row.items()),
              flush=True)
    assert failures == [], failures
