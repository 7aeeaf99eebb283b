"""`zero-lab exec`: a command's `import deepspeed` resolves to the impl asked for, its exit code
passes through, and with --log-contract the engine prints the log contract (docs/log-format.md),
measured against the script's own record of its losses.

Each test runs a real command: `python` or `torchrun` with tests/clients/tiny_deepspeed_script.py.
"""

import math
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

from zero_lab.launch.engine_switch import DROPIN_DIR
from zero_lab.workload.log_contract.log_lines import find_tagged, split_fields

pytestmark = [pytest.mark.slow, pytest.mark.official]

HERE = Path(__file__).resolve().parent
ZERO_LAB = str(Path(sys.executable).with_name("zero-lab"))
TORCHRUN = str(Path(sys.executable).with_name("torchrun"))
SCRIPT = str(HERE / "tiny_deepspeed_script.py")
CONFIG = str(HERE / "tiny_config.json")


def exec_script(impl: str, *launcher: str, log_contract: bool = False, extra: tuple = ()) -> subprocess.CompletedProcess:
    command = [ZERO_LAB, "exec", "--impl", impl, "--device", "cpu", *(["--log-contract"] if log_contract else []),
               "--", *launcher, SCRIPT, "--deepspeed_config", CONFIG, *extra]
    return subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=HERE)


def script_lines(stdout: str, tag: str) -> list[dict]:
    """The script's own `script-<tag> key=value ...` lines as dicts."""
    found = []
    for line in stdout.splitlines():
        if line.startswith(f"script-{tag} "):
            found.append(dict(token.split("=", 1) for token in line.split()[1:]))
    return found


def contract(stdout: str) -> list[tuple[str, int | None, dict]]:
    """The contract lines, found as the CLI finds them (anywhere in a line: the ranks share stdout)."""
    found = []
    for line in stdout.splitlines():
        tagged = find_tagged(line)
        fields = split_fields(tagged[2]) if tagged else None
        if fields is not None:
            found.append((tagged[0], tagged[1], fields))
    return found


WHICH_DEEPSPEED = ("import os, sys, deepspeed; print('script-deepspeed', 'file=' + deepspeed.__file__, "
                   "'accelerator=' + os.environ['DS_ACCELERATOR'], 'initialize=' + deepspeed.initialize.__module__); "
                   "sys.exit(3)")


@pytest.mark.parametrize("impl", ["nano", "official"])
def test_import_deepspeed_is_the_impls_and_the_exit_code_passes_through(impl):
    done = subprocess.run([ZERO_LAB, "exec", "--impl", impl, "--device", "cpu", "--", sys.executable, "-c",
                           WHICH_DEEPSPEED], capture_output=True, text=True, timeout=600, cwd=HERE)
    assert done.returncode == 3, done.stderr[-3000:]
    [said] = script_lines(done.stdout, "deepspeed")
    in_dropin = Path(said["file"]).resolve().is_relative_to(DROPIN_DIR)
    assert in_dropin == (impl == "nano"), said["file"]
    assert said["accelerator"] == "cpu"
    assert not said["initialize"].startswith("zero_lab.clients"), "no log contract unless asked"


@pytest.mark.parametrize("impl", ["nano", "official"])
def test_the_log_contract_of_a_script_at_two_ranks_with_accumulation(impl):
    done = exec_script(impl, TORCHRUN, "--nproc-per-node", "2", log_contract=True, extra=("--steps", "3"))
    assert done.returncode == 0, done.stderr[-3000:]
    lines = contract(done.stdout)
    tags = [tag for tag, _, _ in lines]
    assert tags.count("rank") == 2 and tags.count("zero") == 1 and tags.count("model") == 1
    [zero] = [fields for tag, _, fields in lines if tag == "zero"]
    assert (zero["impl"], zero["stage"], zero["world_size"], zero["gradient_accumulation_steps"]) == (impl, 2, 2, 2)
    assert zero["reduce_bucket_size"] == 20000000 and zero["offload_optimizer"] is None  # `none`
    [model] = [fields for tag, _, fields in lines if tag == "model"]
    assert (model["seq_len"], model["micro_batch"], model["params"]) == (9, 2, 64 * 32 + 32 * 64 + 64)
    steps = {step: fields for tag, step, fields in lines if tag == "opt_step"}
    assert sorted(steps) == [1, 2, 3]

    # The step's loss: the mean over micro-steps and ranks of the losses the script itself saw.
    seen = defaultdict(list)
    for record in script_lines(done.stdout, "loss"):
        seen[int(record["step"])].append(float(record["loss"]))
    for step, fields in steps.items():
        assert len(seen[step]) == 4
        assert math.isclose(fields["loss"], sum(seen[step]) / 4, rel_tol=1e-7), step
        assert fields["tokens_per_s"] > 0 and fields["comm_bytes"] > 0

    # [comm]: every collective of the steps, once; their bytes add up to the steps' own.
    comm = [fields for tag, _, fields in lines if tag == "comm"]
    assert sum(fields["bytes"] for fields in comm) == sum(fields["comm_bytes"] for fields in steps.values())

    # [phase]: the last micro-step of each step, three moments; nano's own buffers are inside what
    # the meter saw, which it can only be if the meter was tracking before the script built its model.
    phases = [fields for tag, _, fields in lines if tag == "phase"]
    assert [fields["phase"] for fields in phases] == ["after_forward", "after_backward", "after_step"] * 3
    if impl == "nano":
        for fields in phases:
            buffers = sum(value for key, value in fields.items() if key.endswith("_bytes")
                          and key not in ("live_bytes", "peak_bytes"))
            assert buffers > 0 and fields["live_bytes"] >= buffers, fields
