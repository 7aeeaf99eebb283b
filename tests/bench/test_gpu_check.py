"""`make gpu-check`'s script, on a machine without a GPU: what it finds missing, what it installs
from the carried wheels and how (the missing distributions alone), the comparisons it runs (their
flags and configs accepted by the CLI), the plan's budget, FusedAdam's background build and its
lock, and the one-line refusals when the machine is not ready."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
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


def test_only_the_missing_distributions_are_installed(gpu_check):
    """Issue 31: every carried wheel went in, pytest too, which then shadowed the machine's own
    pytest while the machine's plugins still loaded. Now: the missing modules' distributions, and
    typing-extensions only where the machine's is absent or older than the carried one."""
    wheels = [Path(name) for name in ("deepspeed-0.19.8-py3-none-any.whl", "hjson-3.1.0-py3-none-any.whl",
                                      "pytest-8.4.2-py3-none-any.whl", "pluggy-1.6.0-py3-none-any.whl",
                                      "pydantic-2.12.4-py3-none-any.whl", "typing_extensions-4.15.0-py3-none-any.whl")]
    older = {"typing-extensions": "4.12.2"}.get
    names = [wheel.name.split("-")[0] for wheel in gpu_check.wheels_to_install(["deepspeed", "hjson"], wheels, older)]
    assert names == ["deepspeed", "hjson", "typing_extensions"]
    newer = {"typing-extensions": "4.15.0"}.get
    names = [wheel.name.split("-")[0] for wheel in gpu_check.wheels_to_install(["pydantic"], wheels, newer)]
    assert names == ["pydantic"]
    assert gpu_check.wheels_to_install([], wheels, lambda name: None) == []


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


def test_the_cli_takes_both_comparisons_as_planned_offload_pinned_and_overlapped(gpu_check, tmp_path, monkeypatch):
    """Both comparisons' flags, in process on a pretended one-GPU machine, each prepared run handed
    back unlaunched: the three-way's six runs, and the offload step's four with the optimizer
    offloaded, pinned and overlapped (issue 31: its configs had overlap_comm false, so nano's queued
    host copies never ran) in the config each impl receives."""
    from typer.testing import CliRunner

    from zero_lab.cli import environment, input_checks, jobs, preflight
    from zero_lab.cli.app import app

    monkeypatch.setattr(environment, "cuda_devices", lambda: ["NVIDIA H200"])
    monkeypatch.setattr(input_checks, "cuda_devices", lambda: ["NVIDIA H200"])
    monkeypatch.setattr(preflight, "free_gpu_bytes", lambda: [140 * 2**30])
    prepared = []
    monkeypatch.setattr(jobs, "run_jobs", lambda runs, env: (prepared.extend(runs), ([], "SIGINT"))[1])
    for step in gpu_check.plan("python3", "1")[1:]:
        command = gpu_check.compare_command("python3", tmp_path / step.label, tmp_path / "r.md",
                                            dict(zip(step.command[4::2], step.command[5::2])))
        CliRunner().invoke(app, command[3:])
    assert [(job.spec.impl, job.spec.stage, job.spec.workload.offload) for job in prepared] == [
        *[(impl, stage, "none") for stage in (2, 3) for impl in ("nano", "official", "fsdp2")],
        *[(impl, stage, "optimizer") for stage in (2, 3) for impl in ("nano", "official")]]
    for job in prepared[6:]:
        assert (job.official_config is not None) == (job.spec.impl == "official")
        for config in filter(None, (job.config, job.official_config)):
            zero = config["zero_optimization"]
            assert zero["overlap_comm"] is True and zero["offload_optimizer"] == {"device": "cpu", "pin_memory": True}
    assert all(not job.config["zero_optimization"].get("overlap_comm") for job in prepared[:6])


@pytest.mark.slow  # starts the CLI in a process of its own (about 10 s of imports)
def test_the_cli_accepts_the_comparison_and_refuses_cuda_here(gpu_check, tmp_path):
    """Its flags parse (a wrong one would be 'No such option'); without a GPU, one error line, exit 2."""
    command = gpu_check.compare_command(sys.executable, tmp_path / "gpu-check-1", tmp_path / "r.md")
    done = subprocess.run(command, capture_output=True, text=True, cwd=REPO, env=gpu_check.environment(None),
                          timeout=120)
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("error: ") and "cuda" in done.stderr.lower() and "Traceback" not in done.stderr


def test_dry_run_prints_the_plan_and_its_budget_and_runs_nothing(gpu_check, capsys):
    assert gpu_check.main(["--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "gpu-tests: " in out and "three-way: " in out and "qwen3-0.6b" in out and "ready:" in out
    assert "--impls nano,official,fsdp2" in out and "fused-adam (in the background from the start)" in out
    assert re.search(r"total +\d+ s +of the 540 s budget; with FusedAdam's build overlapping nothing \d+ s, within "
                     r"the 600 s command: fits", out), out


def test_the_plan_tests_the_gpu_then_compares_three_ways_then_offloads(gpu_check):
    steps = gpu_check.plan("python3", "1")
    assert [step.label for step in steps] == ["gpu-tests", "three-way", "offload"]
    tests, compare, offload = steps
    assert tests.command[1:4] == ["-m", "pytest", "-q"] and tests.command[tests.command.index("-m", 3) + 1] == "gpu"
    assert tests.command[-1] == "tests/gpu" and tests.env == {"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
    for step in (compare, offload):  # nano's collectives run through NCCL on the one GPU
        assert step.env == {"ZERO_LAB_COLLECTIVES_AT_WORLD_ONE": "1"} and step.compare_dir is not None
    three_way = dict(zip(compare.command[4::2], compare.command[5::2]))
    assert three_way["--impls"] == "nano,official,fsdp2" and three_way["--stages"] == "2,3"
    flags = dict(zip(offload.command[4::2], offload.command[5::2]))
    assert flags["--offload"] == "optimizer" and flags["--stages"] == "2,3" and flags["--model"] == "qwen3-0.6b"
    assert flags["--impls"] == "nano,official"  # FSDP2's CPUOffloadPolicy would offload its parameters too
    assert Path(flags["--config"]).name == "offload_overlap.json"
    assert compare.compare_dir != offload.compare_dir
    assert [step.share_s for step in steps] == [1.5 * tests.estimate_s, 1.5 * compare.estimate_s, None]
    assert [step.label for step in gpu_check.plan("python3", "1", ("offload",))] == ["offload"]
    assert gpu_check.plan("python3", "1", ("offload",))[0].share_s is None  # the last step: what is left


def test_the_budget_holds_as_many_runs_as_before_fsdp2_joined(gpu_check):
    """Ten qwen3-0.6b runs, as with stages 1-3 and offload for two impls: six in the three-way
    comparison (three impls, two stages), four with offload (two impls, two stages)."""
    runs = 0
    for step in gpu_check.plan("python3", "1")[1:]:
        flags = dict(zip(step.command[4::2], step.command[5::2]))
        runs += len(flags["--impls"].split(",")) * len(flags["--stages"].split(","))
    assert runs == 10


def test_the_plan_fits_the_budget_and_the_command_with_fused_adams_build(gpu_check):
    """Issue 31: the three-way step (six launches and official's FusedAdam build) was likely to
    overrun its share. Each step's estimate is its runs' starts and steps (ESTIMATE_S); the build
    runs beside the GPU tests and is done before the first official run; all of it fits the
    budget, and the device tool's 10-minute command even if the build overlapped nothing."""
    steps = gpu_check.plan("python3", "1")
    estimate = gpu_check.ESTIMATE_S
    assert steps[1].estimate_s == estimate["comparison"] + 6 * (estimate["run-start"] + 10 * estimate["step"])
    assert steps[2].estimate_s == estimate["comparison"] + 4 * (estimate["run-start"] + 3 * estimate["offload-step"])
    assert gpu_check.builds_fused_adam(steps) and not gpu_check.builds_fused_adam(steps[2:])
    total = estimate["install"] + sum(step.estimate_s for step in steps)
    assert total <= gpu_check.BUDGET_S and total + estimate["fused-adam"] <= gpu_check.COMMAND_LIMIT_S
    lines = gpu_check.budget_lines(steps, True, True, gpu_check.BUDGET_S)
    assert lines[-1].endswith(": fits") and any("the build done" in line for line in lines)
    assert gpu_check.budget_lines(steps, True, True, 300.0)[-1].endswith(": DOES NOT FIT")


def test_without_fused_adam_the_three_way_runs_without_official(gpu_check):
    step = gpu_check.without_official(gpu_check.plan("python3", "1")[1])
    assert dict(zip(step.command[4::2], step.command[5::2]))["--impls"] == "nano,fsdp2"


def test_only_names_steps(gpu_check, capsys):
    assert gpu_check.main(["--dry-run", "--only", "three-way,offload"]) == 0
    out = capsys.readouterr().out
    assert "three-way: " in out and "offload: " in out and "gpu-tests: " not in out
    assert gpu_check.main(["--only", "tests"]) == 2
    assert capsys.readouterr().err == ("error: --only tests is not a step. Pick from gpu-tests,three-way,offload "
                                       "(opt-in: muon)\n")


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


# A builder as torch's: it takes its lock, then builds (here: sleeps); it says whether a lock was there.
LOCKING_BUILDER = ("import pathlib, sys, time; lock = pathlib.Path(sys.argv[1]); "
                   "print('stale' if lock.exists() else 'fresh', flush=True); lock.parent.mkdir(parents=True, "
                   "exist_ok=True); lock.write_text(''); print('building', flush=True); time.sleep(600)")


def test_a_background_build_clears_a_stale_lock_first_and_its_own_when_stopped(gpu_check, tmp_path):
    """torch's extension builder holds a lock file while it builds; one left by a builder stopped
    early makes every later build wait forever. A stale one goes before the build starts, and one
    left by a build gpu-check stops goes once the builder is gone."""
    extensions = tmp_path / "extensions"
    stale = extensions / "py312_cu130" / "fused_adam" / "lock"
    stale.parent.mkdir(parents=True)
    stale.write_text("")
    log = tmp_path / "build.log"
    build = gpu_check.BackgroundBuild([sys.executable, "-c", LOCKING_BUILDER, str(stale)], dict(os.environ), log,
                                      extensions)
    while "building" not in log.read_text():  # the moment the builder has taken its lock
        assert build.state() == "running", log.read_text()
        time.sleep(0.05)
    assert log.read_text().startswith("fresh") and stale.exists() and build.state() == "running"
    build.stop()
    assert not stale.exists() and build.state() == "failed"


def test_a_finished_build_says_so_with_deepspeeds_own_seconds(gpu_check, tmp_path):
    script = "print('Time to load fused_adam op: 61.5 seconds')"
    build = gpu_check.BackgroundBuild([sys.executable, "-c", script], dict(os.environ), tmp_path / "log",
                                      tmp_path / "extensions")
    build.process.wait()
    assert build.state() == "built" and build.seconds_taken() == 61.5
    failing = gpu_check.BackgroundBuild([sys.executable, "-c", "raise SystemExit('nvcc failed')"], dict(os.environ),
                                        tmp_path / "failed.log", tmp_path / "extensions")
    failing.process.wait()
    assert failing.state() == "failed" and failing.tail() == "nvcc failed"


def test_a_rerun_can_use_the_seconds_each_step_and_run_took(gpu_check):
    comparison = {"rows": [{"impl": "nano", "stage": 2, "duration_s": 27.5}, {"impl": "official", "stage": 2,
                                                                               "duration_s": 41.0}]}
    steps = gpu_check.plan(sys.executable, "stamp")
    report = gpu_check.timings({"gpu-tests": 38.24, "three-way": 212.0}, {"three-way": comparison}, steps)
    assert report["steps"]["gpu-tests"] == {"measured_s": 38.2, "estimate_s": gpu_check.ESTIMATE_S["gpu-tests"]}
    three_way = next(step for step in steps if step.label == "three-way")
    assert report["steps"]["three-way"] == {"measured_s": 212.0, "estimate_s": gpu_check.comparison_estimate(three_way.command)}
    assert report["steps"]["three-way"]["estimate_s"] > 0
    assert report["runs"] == {"three-way": {"nano s2": 27.5, "official s2": 41.0}}


def test_the_gpu_tests_stop_at_once_where_zero_labs_dependencies_are_missing(tmp_path):
    """Issue 31: `pytest -m gpu` on a machine without pydantic failed at collection, an ImportError
    per test module. The suite's conftest stops first with one line naming what is missing and
    gpu-check, which installs it (here pydantic is made unimportable, as on the bare machine)."""
    sys.path.insert(0, str(REPO / "tests"))
    from conftest import missing_dependencies

    assert missing_dependencies(lambda name: None if name in ("pydantic", "hjson") else object()) == ["pydantic", "hjson"]
    assert missing_dependencies() == []


@pytest.mark.slow  # a pytest of its own (torch's import)
def test_pytest_without_pydantic_says_what_to_run_in_one_line(tmp_path):
    (tmp_path / "sitecustomize.py").write_text('import sys\nsys.modules["pydantic"] = None  # as if not installed\n')
    done = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", "tests/gpu"],
                          capture_output=True, text=True, cwd=REPO, timeout=120,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO)])})
    assert done.returncode == 4, done.stdout + done.stderr
    assert "ERROR: this Python lacks pydantic" in done.stderr and "make gpu-check" in done.stderr
    assert "Traceback" not in done.stderr + done.stdout


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
    assert lines[0].endswith("| predicted host MB |")
    assert len(lines) == 4 and "PartitionedAdam" in lines[2] and "torch.optim.AdamW" in lines[3]
    assert all("0.0125" in line and "3400.0" in line and "-2.9" in line for line in lines[2:])


def test_docs_cli_shows_the_plan_as_the_dry_run_prints_it(gpu_check):
    doc = (REPO / "docs" / "cli.md").read_text()
    section = doc[doc.index("The plan, as `--dry-run` prints it"):]
    start = section.index("```\n") + 4
    block = section[start:section.index("\n```", start)]
    assert block.splitlines() == gpu_check.budget_lines(gpu_check.plan("python3", "1"), True, True, gpu_check.BUDGET_S)


def test_the_muon_step_is_opt_in(gpu_check):
    """Issue 37: `--only muon` compares nano and official with Muon (fp32, stages 1-3, official's
    Newton-Schulz eager); the default plan leaves it out."""
    assert "muon" not in [step.label for step in gpu_check.plan("python3", "1")]
    [step] = gpu_check.plan("python3", "1", ("muon",))
    flags = dict(zip(step.command[4::2], step.command[5::2]))
    assert (flags["--optimizer"], flags["--stages"], flags["--impls"], flags["--dtype"]) == \
        ("muon", "1,2,3", "nano,official", "float32")
    assert step.env["TORCHDYNAMO_DISABLE"] == "1" and step.share_s is None
