"""What official DeepSpeed's FusedAdam build needs (nvcc, ninja, CUDA_HOME), found the way torch's
extension builder finds it, and `doctor`'s rows for it on a GPU machine (issue 17, finding 2)."""

from __future__ import annotations

from pathlib import Path

from zero_lab.cli.doctor_cmd import toolkit_checks
from zero_lab.workload.cuda_toolkit import cuda_home, toolkit_problems


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
