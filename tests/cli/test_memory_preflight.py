"""The preflight (zero_lab/cli/preflight.py): before anything launches, `run` and `compare` refuse a
run predicted not to fit in a stated --device-memory (exit 2, the figures and the knobs), warn
within 10% of it, let one under it through, and go on with --force; `estimate` gives the same
verdict per row (official stage 3 included: its preallocated buffers are predicted too).

The tiny model at 2 ranks, stage 2, the harness's defaults: 36 MB of tensors predicted per rank, and
on a CPU host what a rank holds beside them (analysis.memory.resident, about 0.4 GB), for each of the
two ranks (printed by the refusal itself, which the tests read rather than hard-code).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from zero_lab.cli.app import app
from zero_lab.launch import torchrun

WORKLOAD = ["--gpus", "2", "--device", "cpu", "--model", "tiny", "--steps", "1", "--stage", "2"]
ONE_STEP = 'import os\nif os.environ["RANK"] == "0":\n    print("[opt_step 1] loss=5.0 alloc_max_mb=1.0", flush=True)\n'
CLI_DOC = Path(__file__).resolve().parents[2] / "docs" / "cli.md"
NEEDED = re.compile(r"2 ranks x (\d+) MB predicted resident = (\d+) MB, (\d+) MB offered \(--device-memory\)")


def invoke(*arguments: str):
    return CliRunner().invoke(app, list(arguments))


def needed_mb(tmp_path: Path) -> int:
    """The two ranks' predicted peak in MB, as the refusal at 1 MB states it."""
    result = invoke("run", *WORKLOAD, "--device-memory", "0.001", "--out", str(tmp_path / "probe"))
    found = NEEDED.search(result.stderr)
    assert found, result.stderr
    return int(found.group(2))


def test_run_refuses_a_run_predicted_over_the_limit_before_anything_starts(tmp_path):
    out = tmp_path / "runs"
    result = invoke("run", *WORKLOAD, "--device-memory", "0.7", "--out", str(out))
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr
    found = NEEDED.search(lines[0])
    assert lines[0].startswith("error: nano w2 s2: will not fit: ") and found, lines[0]
    per_rank, both, offered = map(int, found.groups())
    assert abs(2 * per_rank - both) <= 1 and offered == 717 and both > 1.1 * offered  # beyond the tight band
    for knob in ("--stage", "--offload", "--batch-size", "--seq-len", "--gradient-checkpointing", "--force"):
        assert knob in lines[0]
    shown = re.search(r"`(the cheapest change that fits: [^`]+)`", " ".join(CLI_DOC.read_text().split()))
    assert shown and shown.group(1) in lines[0], "docs/cli.md shows this refusal's change and figures"
    assert not out.exists() or not any(out.iterdir()), "nothing launched, nothing left"


def test_compare_refuses_every_cell_over_the_limit_official_stage_3_included(tmp_path):
    result = invoke("compare", "--gpus", "2", "--device", "cpu", "--model", "tiny", "--steps", "1", "--stages", "2,3",
                    "--device-memory", "0.01", "--out", str(tmp_path))
    assert result.exit_code == 2, result.output
    refused = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert [line.split(":")[1].strip() for line in refused] == ["nano w2 s2", "official w2 s2", "nano w2 s3",
                                                                 "official w2 s3"]


def test_a_limit_on_cpu_is_positive(tmp_path):
    result = invoke("run", *WORKLOAD, "--device-memory", "0", "--out", str(tmp_path))
    assert result.exit_code == 2 and "--device-memory 0.0 is not above 0" in result.stderr


def test_estimate_gives_the_verdict_per_row_against_a_stated_limit():
    result = invoke("estimate", "--model", "tiny", "--gpus", "1,2", "--stages", "2", "--dtype", "float32",
                    "--device-memory", "0.0001", "--format", "json")
    assert result.exit_code == 0, result.output
    payload = json.loads(result.stdout)
    assert payload["memory_offered"] == "0 MB (--device-memory)"
    assert [row["fit"] for row in payload["rows"]] == ["will not fit", "will not fit"]
    roomy = json.loads(invoke("estimate", "--model", "tiny", "--gpus", "1,2", "--stages", "2", "--device-memory", "100",
                              "--format", "json").stdout)
    assert [row["fit"] for row in roomy["rows"]] == ["fits", "fits"]


@pytest.mark.slow  # the runs that go ahead launch torchrun (with a one-step stand-in for the harness)
def test_under_the_limit_runs_within_ten_percent_warns_and_force_goes_on(tmp_path, monkeypatch):
    script = tmp_path / "one_step.py"
    script.write_text(ONE_STEP)
    monkeypatch.setattr(torchrun, "TRAIN_SCRIPT", script)
    needed = needed_mb(tmp_path)
    runs = {"roomy": needed * 2, "tight": needed / 0.95, "forced": needed / 2}
    for name, limit_mb in runs.items():
        extra = ["--force"] if name == "forced" else []
        result = invoke("run", *WORKLOAD, "--device-memory", f"{limit_mb / 1024:.6f}", "--out", str(tmp_path / "runs"),
                        "--name", name, *extra)
        assert result.exit_code == 0, (name, result.output)
        assert json.loads((tmp_path / "runs" / name / "summary.json").read_text())["status"] == "ok"
        warnings = [line for line in result.stderr.splitlines() if line.startswith("warning: nano w2 s2")]
        expected = {"roomy": [], "tight": ["tight"], "forced": ["will not fit"]}[name]
        assert [line.split(": ")[2] for line in warnings] == expected, result.stderr
        assert name != "tight" or warnings[0].endswith("(within 10% of the limit)")


def test_on_a_cuda_machine_each_rank_has_a_gpu_of_its_own_and_the_least_free_one_counts(monkeypatch):
    """estimate on a (pretend) two-GPU machine: per rank against the fuller GPU's free memory, so
    world size 2 fits where on CPU its two ranks would share one memory and not."""
    from zero_lab.cli import estimate_cmd

    from zero_lab.cli import preflight

    free = [80 * 2**20, 50 * 2**20]
    monkeypatch.setattr(estimate_cmd, "cuda_devices", lambda: ["GPU 0", "GPU 1"])
    monkeypatch.setattr(preflight, "free_gpu_bytes", lambda: free)
    arguments = ["estimate", "--model", "tiny", "--gpus", "1,2", "--stages", "2", "--dtype", "float32", "--format", "json"]
    payload = json.loads(invoke(*arguments).stdout)
    assert payload["memory_offered"] == "50 MB (free memory of a GPU)"
    peaks = [row["predicted_peak_mb"] for row in payload["rows"]]
    assert all(peak < 0.9 * 50 for peak in peaks) and 2 * peaks[1] > 50
    assert [row["fit"] for row in payload["rows"]] == ["fits", "fits"]
    monkeypatch.setattr(estimate_cmd, "cuda_devices", lambda: [])
    on_cpu = json.loads(invoke(*arguments, "--device-memory", str(600 / 1024)).stdout)  # a rank's resident ~0.4 GB
    assert [row["fit"] for row in on_cpu["rows"]] == ["fits", "will not fit"]


def test_the_knobs_the_refusal_names_are_flags_and_checkpointing_lowers_the_prediction(tmp_path):
    """The refusal suggests --gradient-checkpointing, a flag of run and compare; given, the
    prediction counts it (one layer's input kept per layer, one layer recomputed: qwen3-0.6b at
    2 ranks, stage 2, predicts less), as --attn-impl eager counts its softmax (more)."""
    def predicted(*extra: str) -> float:
        result = invoke("run", "--gpus", "2", "--device", "cpu", "--model", "qwen3-0.6b", "--steps", "1", "--stage", "2",
                        "--device-memory", "0.001", "--out", str(tmp_path / "probe"), *extra)
        assert result.exit_code == 2 and "--gradient-checkpointing" in result.stderr, result.output
        return float(re.search(r"2 ranks x ([\d.]+) GB predicted resident", result.stderr).group(1))

    import typer

    from zero_lab.analysis.memory.memory_fit import KNOBS

    for command in ("run", "compare"):
        options = {option for parameter in typer.main.get_command(app).commands[command].params for option in parameter.opts}
        missing = [knob for knob in re.findall(r"--[\w-]+", KNOBS) if not any(option.startswith(knob) for option in options)]
        assert not missing, (command, missing)  # compare's --stages for --stage
    plain = predicted()
    assert predicted("--gradient-checkpointing") < plain < predicted("--attn-impl", "eager")


def test_the_gpus_free_memory_is_asked_in_a_child_process_that_takes_its_contexts_along():
    """Issue 31: asking each GPU its free memory in the CLI's own process made a CUDA context on
    every GPU for the whole comparison. A child asks instead; here its real answer (no GPU: empty)
    and what its printed answer becomes; a child that fails offers no figure."""
    import subprocess
    import sys

    from zero_lab.cli import preflight

    assert preflight.free_gpu_bytes() == []  # the real child, on this machine without a GPU
    asked = []

    def child(command, **kwargs):
        asked.append(command)
        return subprocess.CompletedProcess(command, 0, stdout="[85899345920, 42949672960]\n", stderr="")

    assert preflight.free_gpu_bytes(child) == [80 * 2**30, 40 * 2**30]
    assert asked[0][:2] == [sys.executable, "-c"] and "mem_get_info" in asked[0][2]
    failed = lambda command, **kwargs: subprocess.CompletedProcess(command, 1, stdout="", stderr="CUDA error")
    assert preflight.free_gpu_bytes(failed) == []


CHEAPEST = re.compile(r"the cheapest change that fits: (--[\w-]+(?: \d+)?) \(")


@pytest.mark.slow  # the run that goes ahead launches torchrun (with a one-step stand-in for the harness)
def test_the_cheapest_change_the_refusal_names_fits_when_given(tmp_path, monkeypatch):
    """Refused at a limit under its prediction, a run names one change and its predicted figures; run
    again with that change alone at the same limit, it passes the preflight and runs."""
    script = tmp_path / "one_step.py"
    script.write_text(ONE_STEP)
    monkeypatch.setattr(torchrun, "TRAIN_SCRIPT", script)
    limit_gb = f"{0.75 * needed_mb(tmp_path) / 1024:.6f}"
    refused = invoke("run", *WORKLOAD, "--device-memory", limit_gb, "--out", str(tmp_path / "refused"))
    assert refused.exit_code == 2, refused.output
    change = CHEAPEST.search(refused.stderr)
    assert change, refused.stderr
    again = invoke("run", *WORKLOAD, *change.group(1).split(), "--device-memory", limit_gb, "--out", str(tmp_path / "runs"),
                   "--name", "changed")
    assert again.exit_code == 0 and "will not fit" not in again.stderr, again.output
    assert json.loads((tmp_path / "runs" / "changed" / "summary.json").read_text())["status"] == "ok"


def test_the_changes_come_cheapest_first_and_each_changes_one_thing(tmp_path):
    """A higher stage, then gradient checkpointing, offload (on CUDA only: on a CPU every byte is the
    host's), a smaller micro-batch, fewer ranks on a CPU host; each candidate differs from the job in
    the one thing its flag names, and checkpointing or a smaller micro-batch predicts less."""
    from zero_lab.cli import jobs, preflight

    shared = jobs.SharedSettings(None, "cpu", torchrun.Workload(model="tiny", steps=1, batch_size=4),
                                 torchrun.MultiNode(), [])
    job = jobs.prepare(shared, "nano", 1, 2, tmp_path / "run")
    on_cpu = dict(preflight.changes(job, "cpu"))
    assert list(on_cpu) == ["--stage 2", "--stage 3", "--gradient-checkpointing", "--batch-size 2", "--batch-size 1",
                            "--gpus 1"]
    assert on_cpu["--stage 3"].config["zero_optimization"]["stage"] == on_cpu["--stage 3"].spec.stage == 3
    assert on_cpu["--gpus 1"].spec.nproc == 1 and on_cpu["--batch-size 2"].config["train_micro_batch_size_per_gpu"] == 2
    peak = preflight.job_prediction(job).peak
    assert preflight.job_prediction(on_cpu["--gradient-checkpointing"]).peak < peak
    assert preflight.job_prediction(on_cpu["--batch-size 2"]).peak < peak
    assert job.config["train_micro_batch_size_per_gpu"] == 4 and job.spec.stage == 1, "the job itself is unchanged"
    stage3 = jobs.prepare(shared, "nano", 3, 2, tmp_path / "run3")
    on_cuda = [flag for flag, _ in preflight.changes(stage3, "cuda")]
    assert on_cuda == ["--gradient-checkpointing", "--offload optimizer", "--offload param", "--batch-size 2",
                       "--batch-size 1"]


@pytest.mark.slow  # the cell that goes ahead launches torchrun (with a one-step stand-in for the harness)
def test_compare_runs_the_cells_that_fit_and_reports_the_refused_ones_as_rows(tmp_path, monkeypatch):
    """Official's stage 2 predicts more than nano's on the tiny model (DeepSpeed's import, its staging
    buffer's written part): at a limit where nano's cell is inside the tight band (within 10% over) and
    official's beyond it, nano's cell runs and official's is a `refused` row, said on stderr with what
    would fit (one rank: the process's own memory, not the model, fills the limit); a refusal fails
    nothing (exit 0)."""
    script = tmp_path / "one_step.py"
    script.write_text(ONE_STEP)
    monkeypatch.setattr(torchrun, "TRAIN_SCRIPT", script)
    nano = needed_mb(tmp_path)
    result = invoke("compare", "--gpus", "2", "--device", "cpu", "--model", "tiny", "--steps", "1", "--stages", "2",
                    "--device-memory", f"{1.005 * nano / 1.1 / 1024:.6f}", "--out", str(tmp_path / "cmp"),
                    "--format", "json")
    assert result.exit_code == 0, result.output
    rows = {row["impl"]: row for row in json.loads(result.stdout)["rows"]}
    assert rows["nano"]["status"] == "ok" and rows["official"]["status"] == "refused", rows
    assert rows["official"]["error"].startswith("refused: will not fit: 2 ranks x ")
    notes = [line for line in result.stderr.splitlines() if line.startswith("note: official w2 s2: will not fit")]
    assert len(notes) == 1 and "not run (refused); the cheapest change that fits: --gpus 1" in notes[0], result.stderr
    assert not list((tmp_path / "cmp").glob("*/cells/w2-s2-official")), "a refused cell launches nothing"


@pytest.mark.slow  # nano's cell launches torchrun (a one-step stand-in for the harness)
def test_the_issues_case_refuses_officials_stage_3_and_runs_nanos(tmp_path, monkeypatch):
    """qwen3-0.6b in fp32 at stage 3 on 2 CPU ranks, with the 22.9 GB a 24 GB machine had available: official's
    cell (2 x 14.2 GB predicted resident, beyond the tight band) is refused before anything launches, with
    the change that fits; nano's (2 x 11.7 GB, within 10% over the limit: inside the prediction's own error;
    measured, its ranks peaked at 11.1 GB each) runs with a warning; `--force` runs official's too.
    docs/cli.md tells this case with these figures."""
    script = tmp_path / "one_step.py"
    script.write_text(ONE_STEP)
    monkeypatch.setattr(torchrun, "TRAIN_SCRIPT", script)
    case = ["--gpus", "2", "--device", "cpu", "--model", "qwen3-0.6b", "--steps", "1", "--device-memory", "22.9"]
    result = invoke("compare", *case, "--stages", "3", "--out", str(tmp_path / "cmp"), "--format", "json")
    assert result.exit_code == 0, result.output
    rows = {row["impl"]: row for row in json.loads(result.stdout)["rows"]}
    assert rows["nano"]["status"] == "ok" and rows["official"]["status"] == "refused", rows
    lines = result.stderr.splitlines()
    tight = "warning: nano w2 s3: tight: 2 ranks x 11.7 GB predicted resident = 23.4 GB, 22.9 GB offered"
    refused = "note: official w2 s3: will not fit: 2 ranks x 14.2 GB predicted resident = 28.5 GB, 22.9 GB offered"
    assert any(line.startswith(tight) for line in lines) and any(line.startswith(refused) for line in lines), lines
    refusal = next(line for line in lines if line.startswith(refused))
    assert "the cheapest change that fits: --gradient-checkpointing" in refusal
    prose = " ".join(CLI_DOC.read_text().split())
    assert "2 x 14.2 GB" in prose and "2 x 11.7 GB" in prose and "22.9 GB" in prose
    forced = invoke("run", *case, "--impl", "official", "--stage", "3", "--out", str(tmp_path / "runs"), "--force")
    assert forced.exit_code == 0, forced.output
    assert "will not fit" in forced.stderr and "going on (--force)" in forced.stderr, forced.stderr
