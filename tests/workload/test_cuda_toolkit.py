"""What official DeepSpeed's FusedAdam build needs (nvcc, ninja, CUDA_HOME), found the way torch's
extension builder finds it, and `doctor`'s rows for it on a GPU machine (issue 17, finding 2)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from zero_lab.cli.doctor_cmd import toolkit_checks
from zero_lab.workload.engines.cuda_toolkit import cuda_home, deepspeed_arch_list, toolkit_problems


def toolkit(root: Path, nvcc: bool = True) -> Path:
    (root / "bin").mkdir(parents=True)
    if nvcc:
        (root / "bin" / "nvcc").write_text("")
    return root


def test_a_complete_toolkit_has_no_problem(tmp_path):
    home = toolkit(tmp_path / "cuda")
    which = {"ninja": "/usr/bin/ninja"}.get
    assert toolkit_problems({"CUDA_HOME": str(home)}, which, tmp_path / "none") == []


def test_cuda_home_is_found_as_torch_finds_it(tmp_path):
    home = toolkit(tmp_path / "cuda-12")
    assert cuda_home({"CUDA_PATH": str(home)}, lambda name: None, tmp_path / "none") == home
    nvcc_on_path = {"nvcc": str(home / "bin" / "nvcc")}.get
    assert cuda_home({}, nvcc_on_path, tmp_path / "none") == home.resolve()
    assert cuda_home({}, lambda name: None, home) == home
    assert cuda_home({}, lambda name: None, tmp_path / "none") is None


def test_each_missing_piece_is_named(tmp_path):
    empty = toolkit(tmp_path / "cuda", nvcc=False)
    problems = toolkit_problems({"CUDA_HOME": str(empty)}, lambda name: None, tmp_path / "none")
    assert problems == [f"no nvcc in {empty / 'bin'}", "no ninja on PATH"]
    assert toolkit_problems({}, {"ninja": "/x/ninja"}.get, tmp_path / "none") == [
        "no CUDA_HOME (and no nvcc on PATH, no /usr/local/cuda)"]


def test_doctor_checks_the_toolkit_on_a_gpu_machine(tmp_path):
    home = toolkit(tmp_path / "cuda")
    rows = {name: (ok, detail, fix) for name, ok, detail, fix in
            toolkit_checks("cuda", {"CUDA_HOME": str(home)}, lambda name: None)}
    assert set(rows) == {"CUDA_HOME", "nvcc", "ninja"}
    assert rows["CUDA_HOME"][0] and rows["nvcc"][0] and rows["nvcc"][1] == str(home / "bin" / "nvcc")
    assert not rows["ninja"][0] and "pip install ninja" in rows["ninja"][2] and "torch.optim.AdamW" in rows["ninja"][2]
    assert all(ok for _, ok, _, _ in toolkit_checks("cpu", {}, lambda name: None))


@pytest.mark.parametrize("arch_list, readable", [("9.0a", "9.0"), ("8.0;9.0a+PTX", "8.0;9.0+PTX"),
                                                 ("9.0 9.0a", "9.0"), ("10.0f;12.0", "10.0;12.0")])
def test_official_builder_reads_the_arch_list_once_its_suffixes_are_dropped(monkeypatch, arch_list, readable):
    """The first H200 run's image set TORCH_CUDA_ARCH_LIST=9.0a, and official DeepSpeed's own
    FusedAdam builder stopped on it; the rewritten list is one that builder reads."""
    monkeypatch.setenv("DS_ACCELERATOR", "cpu")
    from deepspeed.ops.op_builder.fused_adam import FusedAdamBuilder

    builder = FusedAdamBuilder()
    builder.jit_mode = True
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", arch_list)
    with pytest.raises(ValueError, match="invalid literal for int"):
        builder.compute_capability_args()
    assert deepspeed_arch_list(arch_list) == readable
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", readable)
    builder.compute_capability_args()


def test_official_runs_on_cuda_get_the_readable_arch_list(monkeypatch):
    from zero_lab.workload.engines.official_import import prepare_environment

    for name in ("DS_ACCELERATOR", "TORCH_EXTENSIONS_DIR"):  # restored after the test: prepare_environment sets them
        monkeypatch.setenv(name, os.environ.get(name, ""))
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "9.0a")
    prepare_environment("cuda")
    assert os.environ["TORCH_CUDA_ARCH_LIST"] == "9.0"
