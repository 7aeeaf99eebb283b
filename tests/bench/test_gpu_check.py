"""`make gpu-check`'s script, on a machine without a GPU: what it finds missing, what it installs
from the carried wheels and how, the comparison it runs (its flags accepted by the CLI), and the
one-line refusals when the machine is not ready."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.scripts import REPO, load_script


@pytest.fixture(scope="module")
def gpu_check():
    return load_script("bench/gpu_check.py", "gpu_check")


def test_missing_modules_are_those_python_cannot_find(gpu_check):
    absent = {"deepspeed", "hjson"}
    found = gpu_check.missing_modules(lambda name: None if name in absent else object())
    assert found == ["deepspeed", "hjson"]


def test_a_missing_module_needs_its_wheel(gpu_check):
    wheels = [Path("deepspeed-0.19.8-py3-none-any.whl"), Path("hjson-3.1.0-py3-none-any.whl")]
    assert gpu_check.check_wheels(["deepspeed", "hjson"], wheels) is None
    problem = gpu_check.check_wheels(["deepspeed", "pydantic_core"], wheels)
    assert "pydantic-core" in problem and "deepspeed" not in problem.split(" and ")[0] and "make gpu-wheels" in problem
    core = Path("pydantic_core-2.50.5-cp312-cp312-manylinux_2_17_x86_64.whl")
    assert gpu_check.check_wheels(["pydantic_core"], [core]) is None


def test_install_is_offline_without_dependencies_into_the_checkout(gpu_check, tmp_path):
    wheels = [tmp_path / "hjson-3.1.0-py3-none-any.whl"]
    command = gpu_check.install_command("python3", wheels, tmp_path / "site")
    assert command[:4] == ["python3", "-m", "pip", "install"]
    assert {"--no-index", "--no-deps"} <= set(command)
    assert command[command.index("--target") + 1] == str(tmp_path / "site") and command[-1] == str(wheels[0])


def test_wheels_are_built_or_downloaded_at_the_tested_versions(gpu_check, tmp_path):
    names = [*gpu_check.NEEDED.values(), *gpu_check.ALSO_CARRIED]
    versions = {name: f"1.{index}" for index, name in enumerate(names)}
    build, download = gpu_check.wheel_build_commands("py", "3.12", versions, tmp_path)
    assert build[3] == "wheel" and [arg for arg in build if "==" in arg] == ["deepspeed==" + versions["deepspeed"]]
    pins = {arg for arg in download if "==" in arg}
    assert pins == {f"{name}=={versions[name]}" for name in names if name != "deepspeed"}
    assert download[download.index("--python-version") + 1] == "3.12" and "--only-binary=:all:" in download


def test_the_comparison_is_the_issues_three_way_workload(gpu_check, tmp_path):
    """Issue 19's three-way comparison on one GPU: qwen3-0.6b, bf16, stages 2 and 3 (FSDP2 has no
    stage 1), nano, official and FSDP2, official the baseline (compare's default)."""
    command = gpu_check.compare_command("python3", tmp_path / "gpu-check-1", tmp_path / "r.md")
    flags = dict(zip(command[4::2], command[5::2]))
    assert command[1:4] == ["-m", "zero_lab.cli.app", "compare"]
    assert flags["--model"] == "qwen3-0.6b" and flags["--dtype"] == "bfloat16" and flags["--gpus"] == "1"
    assert flags["--stages"] == "2,3" and flags["--steps"] == "10" and flags["--device"] == "cuda"
    assert flags["--impls"].split(",") == ["nano", "official", "fsdp2"] and "--baseline" not in flags


@pytest.mark.slow  # starts the CLI in a process of its own (about 10 s of imports)
def test_the_cli_accepts_the_comparison_and_refuses_cuda_here(gpu_check, tmp_path):
    """Its flags parse (a wrong one would be 'No such option'); without a GPU, one error line, exit 2."""
    command = gpu_check.compare_command(sys.executable, tmp_path / "gpu-check-1", tmp_path / "r.md")
    done = subprocess.run(command, capture_output=True, text=True, cwd=REPO, env=gpu_check.environment(None),
                          timeout=120)
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("error: ") and "cuda" in done.stderr.lower() and "Traceback" not in done.stderr


def test_dry_run_prints_the_plan_and_runs_nothing(gpu_check, capsys):
    assert gpu_check.main(["--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "gpu tests (" in out and "three-way (" in out and "qwen3-0.6b" in out and "ready:" in out
    assert "--impls nano,official,fsdp2" in out


def test_the_plan_tests_the_gpu_then_compares_three_ways_then_offloads(gpu_check):
    steps = gpu_check.plan("python3", "1")
    assert [step.label for step in steps] == ["gpu tests", "three-way", "compare offload"]
    tests, compare, offload = steps
    assert tests.command[1:4] == ["-m", "pytest", "-q"] and tests.command[tests.command.index("-m", 3) + 1] == "gpu"
    for step in (compare, offload):  # nano's collectives run through NCCL on the one GPU
        assert step.env == {"ZERO_LAB_COLLECTIVES_AT_WORLD_ONE": "1"} and step.compare_dir is not None
    three_way = dict(zip(compare.command[4::2], compare.command[5::2]))
    assert three_way["--impls"] == "nano,official,fsdp2" and three_way["--stages"] == "2,3"
    flags = dict(zip(offload.command[4::2], offload.command[5::2]))
    assert flags["--offload"] == "optimizer" and flags["--stages"] == "2,3" and flags["--model"] == "qwen3-0.6b"
    assert flags["--impls"] == "nano,official"  # FSDP2's CPUOffloadPolicy would offload its parameters too
    assert compare.compare_dir != offload.compare_dir
    assert sum(step.share_s for step in steps if step.share_s) < gpu_check.BUDGET_S < 8 * 60


def test_the_budget_holds_as_many_runs_as_before_fsdp2_joined(gpu_check):
    """Ten qwen3-0.6b runs, as with stages 1-3 and offload for two impls: six in the three-way
    comparison (three impls, two stages), four with offload (two impls, two stages)."""
    runs = 0
    for step in gpu_check.plan("python3", "1")[1:]:
        flags = dict(zip(step.command[4::2], step.command[5::2]))
        runs += len(flags["--impls"].split(",")) * len(flags["--stages"].split(","))
    assert runs == 10


def test_no_step_may_run_so_long_that_it_could_not_be_stopped_in_budget(gpu_check):
    step = gpu_check.Step("compare", ["x"], share_s=220.0)
    assert gpu_check.step_time_s(step, 470.0) == 220.0
    assert gpu_check.step_time_s(step, 100.0) == 100.0 - gpu_check.GRACE_S
    assert gpu_check.step_time_s(gpu_check.Step("last", ["x"]), 200.0) == 200.0 - gpu_check.GRACE_S


SLEEPER = [sys.executable, "-c", "import time; time.sleep(600)"]


def test_a_step_past_its_time_is_stopped_with_sigterm_first(gpu_check):
    code, late = gpu_check.run_step(SLEEPER, dict(os.environ), timeout_s=1.0, grace_s=60.0)
    assert late and code == -signal.SIGTERM


def test_a_step_that_ignores_sigterm_is_killed_after_the_grace(gpu_check):
    previous = signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the step inherits it from its start
    try:
        code, late = gpu_check.run_step(SLEEPER, dict(os.environ), timeout_s=1.0, grace_s=1.0)
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert late and code == -signal.SIGKILL


def test_each_line_of_a_three_way_table_gets_its_own_impls_largest_loss_delta(gpu_check):
    """Three impls make three deltas per cell: a line shows the largest it takes part in."""
    rows = [{"world_size": 1, "stage": 3, "impl": impl, "status": "ok"} for impl in ("nano", "official", "fsdp2")]
    deltas = [{"world_size": 1, "stage": 3, "impl": "nano", "baseline": "official", "max_step_loss_delta": 0.001},
              {"world_size": 1, "stage": 3, "impl": "fsdp2", "baseline": "official", "max_step_loss_delta": 0.02},
              {"world_size": 1, "stage": 3, "impl": "nano", "baseline": "fsdp2", "max_step_loss_delta": 0.004},
              {"world_size": 1, "stage": 2, "impl": "nano", "baseline": "official", "max_step_loss_delta": 0.3}]
    assert [gpu_check.largest_loss_delta(deltas, row) for row in rows] == [0.004, 0.02, 0.02]
    deltas[2]["max_step_loss_delta"] = None  # NaN in a loss: unknown, not small
    assert [gpu_check.largest_loss_delta(deltas, row) for row in rows] == [None, 0.02, None]
    lines = gpu_check.compact_table([{"rows": rows, "deltas": deltas[:2]}]).splitlines()
    assert "0.001000" in lines[2] and "0.020000" in lines[3] and "0.020000" in lines[4]


def test_the_compact_table_has_a_line_per_run_with_its_optimizer(gpu_check):
    rows = [{"world_size": 1, "stage": 2, "impl": impl, "status": "ok", "offload": "optimizer", "optimizer": name,
             "alloc_max_mb": 1200.0, "peak_alloc_max_mb": 3400.0, "step_ms": 812.0, "predicted_peak_mb": 3300.0,
             "peak_error_pct": -2.9} for impl, name in (("nano", "PartitionedAdam"), ("official", "torch.optim.AdamW"))]
    table = gpu_check.compact_table([{"rows": rows, "deltas": [{"world_size": 1, "stage": 2, "impl": "nano", "baseline": "official",
                                                                   "max_step_loss_delta": 0.0125}]}])
    lines = table.splitlines()
    assert "optimizer" in lines[0] and "max loss delta" in lines[0] and "predicted peak MB" in lines[0]
    assert len(lines) == 4 and "PartitionedAdam" in lines[2] and "torch.optim.AdamW" in lines[3]
    assert all("0.0125" in line and "3400.0" in line and "-2.9" in line for line in lines[2:])
