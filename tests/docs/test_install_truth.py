"""The README's set-up and first steps, as they are: what `make setup` installs and downloads
(bench/torch_download.json, measured by bench/torch_download.py), the venv module Debian lacks, the
one wheel index the docs name, what `make demo` prints (reports/cpu-demo.md) and the Chinese
README's summary of the Use block."""

from __future__ import annotations

import json
import re
import shutil
import subprocess

import pytest

from tests.docs.doc_text import DOCS, REPO, read, table_after

README, CHINESE = read(REPO / "README.md"), read(REPO / "README.zh-CN.md")
DOWNLOADS = json.loads((REPO / "bench" / "torch_download.json").read_text())
CPU_INDEX = "https://download.pytorch.org/whl/cpu"


def make_commands(*arguments: str) -> str:
    """What `make setup` would run (`make -n`: nothing runs), into a venv that is not there."""
    done = subprocess.run(["make", "-n", "-B", "setup", "VENV=/nonexistent/venv", *arguments], cwd=REPO,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


needs_make = pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")


@needs_make
def test_make_setup_installs_the_cpu_build_unless_asked_for_cuda():
    cpu, cuda = make_commands(), make_commands("TORCH=cuda")
    assert f'"{DOWNLOADS["cpu"]["requirement"]}"' in cpu and f"--extra-index-url {CPU_INDEX}" in cpu
    assert f'"{DOWNLOADS["cuda"]["requirement"]}"' in cuda and "+cpu" not in cuda and "index-url" not in cuda


@needs_make
def test_a_python_without_venv_is_one_line_naming_the_debian_package(tmp_path):
    done = subprocess.run(["make", "setup", "PYTHON=false", f"VENV={tmp_path / 'venv'}"], cwd=REPO,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode != 0 and not (tmp_path / "venv").exists()
    errors = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "apt-get install python3-venv" in errors[0], done.stderr
    for readme in (README, CHINESE):
        assert "apt-get install python3-venv" in readme


def test_the_only_wheel_index_named_is_pytorchs_cpu_one():
    """The CPU index has torch 2.13.0+cpu (bench/torch_download.json's cpu resolution); no other
    index of PyTorch's is named, none having been checked for 2.13 wheels."""
    for path in [*DOCS, REPO / "Makefile", *sorted((REPO / ".github" / "workflows").glob("*.yml"))]:
        named = set(re.findall(r"https://download\.pytorch\.org/whl/[\w.]*", read(path)))
        assert named <= {CPU_INDEX}, (path.name, named)


def test_the_readmes_download_figures_are_the_measured_ones():
    cpu, cuda = DOWNLOADS["cpu"], DOWNLOADS["cuda"]
    torch_cpu = next(wheel["bytes"] for wheel in cpu["wheels"] if wheel["name"] == "torch")
    torch_cuda = next(wheel["bytes"] for wheel in cuda["wheels"] if wheel["name"] == "torch")
    nvidia = [wheel["bytes"] for wheel in cuda["wheels"] if wheel["name"].startswith("nvidia-")]
    minutes = cuda["bytes"] / 10e6 / 60  # at 10 MB/s
    stated = {"cpu MB": f"{cpu['bytes'] / 1e6:.0f}", "torch cpu MB": f"{torch_cpu / 1e6:.0f}",
              "cuda MB": f"{cuda['bytes'] / 1e6:,.0f}", "cuda wheels": str(len(cuda["wheels"])),
              "nvidia wheels": str(len(nvidia)), "nvidia MB": f"{sum(nvidia) / 1e6:,.0f}",
              "torch cuda MB": f"{torch_cuda / 1e6:.0f}", "minutes": f"{minutes:.1f}"}
    english = " ".join(README.split())
    assert (f"`torch==2.13.0+cpu`: {stated['cpu MB']} MB of wheels, {stated['torch cpu MB']} MB of them torch's own"
            in english)
    assert (f"{stated['cuda MB']} MB in {stated['cuda wheels']} wheels, {stated['nvidia MB']} MB of them in "
            f"{stated['nvidia wheels']} `nvidia-*` wheels and {stated['torch cuda MB']} MB torch's own, about "
            f"{stated['minutes']} minutes at 10 MB/s") in english
    chinese = " ".join(CHINESE.split())
    for figure in stated.values():
        assert figure in chinese, figure


def demo_section(text: str) -> str:
    return text.split("What `make demo` prints")[1].split("## ")[0] if "What `make demo` prints" in text else \
        text.split("`make demo` 打印")[1].split("## ")[0]


@pytest.mark.parametrize("readme", [README, CHINESE], ids=["README.md", "README.zh-CN.md"])
def test_the_demo_excerpt_is_the_committed_reports(readme):
    demo = read(REPO / "reports" / "cpu-demo.md")
    section = demo_section(readme)
    verdict = next(line for line in section.splitlines() if line.startswith("**Verdict"))
    assert verdict == demo.splitlines()[2]
    rows = [line for line in section.splitlines() if line.startswith("| ") and not line.startswith("| metric")]
    stage3 = demo.split("## world size 2, stage 3: nano vs official")[1].split("\n## ")[0].splitlines()
    assert len(rows) >= 4 and all(row in stage3 for row in rows), [row for row in rows if row not in stage3]


@pytest.mark.parametrize("readme", [README, CHINESE], ids=["README.md", "README.zh-CN.md"])
def test_how_to_read_the_demo_states_its_figures(readme):
    demo = read(REPO / "reports" / "cpu-demo.md")
    stage3 = {row[0]: row[1:] for row in table_after(demo, "## world size 2, stage 3: nano vs official")[1:]}
    reading = " ".join(demo_section(readme).split("| loss parity")[1].split())
    alloc, peak = stage3["alloc MB"], stage3["peak alloc MB"]
    for figure in (alloc[0], alloc[1], peak[0], peak[1]):
        assert f"{figure} MB" in reading or f"{figure} 对" in reading or f"{figure} against" in reading, figure
    ratios = {stage: {row[0]: row[1:] for row in table_after(demo, f"## world size 2, stage {stage}: nano vs official")[1:]}
              ["wire MB / step"][3].removeprefix("ratio ") for stage in (1, 2, 3)}
    assert ratios[1] == ratios[2] and f"{ratios[1]}" in reading and f"{ratios[3]}" in reading
    tolerance = re.search(r"tolerance ([\d.]+)", demo.splitlines()[2])[1]
    assert f"{tolerance} in fp32" in reading or f"fp32 为 {tolerance}" in reading


def test_the_chinese_summary_of_the_use_block_names_every_command_group():
    """One clause (；) per comment line of the Use block, in order."""
    block = re.search(r"## Use\n\n```bash\n(.*?)```", README, flags=re.S)[1]
    comments = [line for line in block.splitlines() if line.startswith("# ")]
    summary = re.search(r"（依次是：(.*?)。）", CHINESE, flags=re.S)[1]
    assert len(summary.split("；")) == len(comments), (len(summary.split("；")), len(comments))
    for term in ("checkpoint", "逐阶段", "FSDP2", "--ranks-per-node"):
        assert term in summary, term


def test_the_first_comparison_of_the_use_block_runs_on_a_cpu_and_the_gpu_one_is_labelled():
    block = re.search(r"## Use\n\n```bash\n(.*?)```", README, flags=re.S)[1].splitlines()
    first = next(index for index, line in enumerate(block) if line.startswith("zero-lab compare "))
    assert "--device cpu" in block[first] and "CPU" in block[first - 1]
    assert "--gpus 2,8" in block[first + 2] and "GPUs" in block[first + 1]


def test_both_readmes_give_make_tests_duration_as_the_suite_reports_it():
    """The range the README gives is the one the suite's closing line sets its own duration beside
    (tests/conftest.py's pytest_terminal_summary), and the Chinese README gives the same."""
    from tests.conftest import STATED_DURATION

    low, high = STATED_DURATION.search(" ".join(README.split())).groups()
    assert int(low) < int(high) and f"需 {low} 到 {high} 分钟" in CHINESE
