"""CLI behaviour that needs no launch: bad input, parse, report, estimate, config official."""

import io
import re
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from zero_lab.analysis.runs.rundir import write_json
from zero_lab.cli.app import app

runner = CliRunner()
REPO = Path(__file__).resolve().parents[2]

OUR_LOG = """\
[default0]:[zero] impl=nano stage=2 world_size=2 reduce_scatter=True
[default0]:[opt_step 1] loss=5.5 alloc_max_mb=20.0 peak_alloc_max_mb=30.0 step_ms=100.0
[default0]:[opt_step 2] loss=5.4 alloc_max_mb=21.0 peak_alloc_max_mb=31.0 step_ms=90.0
[default0]:[phase] step=2 phase=after_forward live_bytes=4096 peak_bytes=8192
[default0]:[opt_step 3] loss=5.3 alloc_m
"""
SEED_LOG = "[opt_step 1] loss=2.3 cuda_alloc_max_mb=7340.5 cuda_peak_alloc_max_mb=10260.2\n"


def one_line_error(result):
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert "Traceback" not in result.output
    return lines[0]


@pytest.mark.parametrize("arguments, words", [
    (["compare", "--stages", "1,x"], "--stages must be a comma-separated list"),
    (["compare", "--stages", "7"], "ZeRO stage 7 does not exist (--stages)"),
    (["compare", "--device", "cpu", "--stages", "1,4"], "ZeRO stage 4 does not exist (--stages)"),
    (["run", "--device", "cpu", "--stage", "7"], "ZeRO stage 7 does not exist (--stage)"),
    (["compare", "--impls", "nano,megatron"], "unknown impl 'megatron'"),
    (["compare", "--format", "yaml"], "--format yaml"),
    (["compare", "--device", "cpu", "--dtype", "float16"], "official DeepSpeed rejects fp16"),
    (["compare", "--device", "cpu", "--model", "no-such-model"], "--model 'no-such-model' is neither a preset"),
    (["estimate", "--model", "nope"], "--model 'nope' is neither a preset"),
    (["compare", "--device", "cpu", "--config", "missing.json"], "missing.json does not exist"),
    (["run", "--device", "cpu", "--impl", "megatron"], "unknown impl"),
    (["run", "--device", "cpu", "--steps", "0"], "--steps must be at least 1"),
    (["run", "--device", "cpu", "--batch-size", "0"], "--batch-size 0 is not a micro-batch size"),
    (["compare", "--device", "cpu", "--batch-size", "-2"], "--batch-size -2 is not a micro-batch size"),
    (["run", "--device", "cpu", "--seq-len", "1"], "--seq-len 1 leaves no token to predict"),
    (["compare", "--device", "cpu", "--loss-tol", "-1e-4"], "--loss-tol -0.0001 is negative"),
    (["compare", "--device", "cpu", "--fail-on-regression", "-5"], "--fail-on-regression -5.0 is negative"),
    (["compare", "--device", "cpu", "--warmup-steps", "-1"], "--warmup-steps -1 is negative"),
    (["run", "--device", "cpu", "--stall-timeout", "-1"], "--stall-timeout -1.0 is negative"),
    (["compare", "--device", "cpu", "--stall-timeout", "-5"], "--stall-timeout -5.0 is negative"),
    (["report", "nowhere", "--loss-tol", "-1"], "--loss-tol -1.0 is negative"),
    (["parse", "missing.log"], "missing.log does not exist"),
    (["parse", str(REPO / "docs")], "docs is a directory"),
    (["report", str(REPO / "pyproject.toml")], "pyproject.toml is a file, not a directory"),
    (["report", "nowhere"], "nowhere does not exist"),
    (["estimate", "--dtype", "int8"], "--dtype int8 is not one of float32, bfloat16, float16"),
    (["estimate", "--format", "xml"], "--format xml is not one of table, json"),
    (["run", "--device", "tpu"], "--device tpu is not one of auto, cpu, cuda"),
    (["compare", "--device", "tpu"], "--device tpu is not one of auto, cpu, cuda"),
    (["config", "official", "missing.json", "--device", "tpu"], "--device tpu is not one of auto, cpu, cuda"),
    (["run", "--device", "cpu", "--dtype", "fp8"], "--dtype fp8 is not one of float32, bfloat16, float16"),
    (["run", "--device", "cpu", "--format", "csv"], "--format csv is not one of table, json"),
    (["parse", "missing.log", "--format", "xml"], "--format xml is not one of table, csv, json"),
    (["run", "--device", "cpu", "--peak-tflops", "0"], "--peak-tflops 0.0 is not above 0"),
    (["compare", "--device", "cpu", "--peak-tflops", "-3"], "--peak-tflops -3.0 is not above 0"),
])
def test_bad_input_is_one_line_and_exit_2(arguments, words, monkeypatch):
    from zero_lab.launch import torchrun_job

    def no_launch(*args, **kwargs):
        raise AssertionError("bad input launched torchrun")

    monkeypatch.setattr(torchrun_job.subprocess, "Popen", no_launch)
    assert words in one_line_error(runner.invoke(app, arguments))


DATASETS = {
    "empty.jsonl": ("", "holds no records"),
    "malformed.jsonl": ('{"text": "fine"}\n{"text": oops}\n', "line 2 is not valid JSON"),
    "no-usable-record.jsonl": ('{"text": ""}\n', "no record of"),
    "neither-form.jsonl": ('{"prompt": "hi"}\n', "has neither 'conversations' nor a 'text' string"),
    "a-directory": (None, "is a directory"),
}


@pytest.mark.parametrize("name", DATASETS)
@pytest.mark.parametrize("command", ["run", "compare"])
def test_a_bad_dataset_is_one_line_and_exit_2_before_anything_launches(tmp_path, monkeypatch, command, name):
    from zero_lab.launch import torchrun_job

    content, words = DATASETS[name]
    dataset = tmp_path / name
    dataset.mkdir() if content is None else dataset.write_text(content)
    monkeypatch.setattr(torchrun_job.subprocess, "Popen", lambda *args, **kwargs: pytest.fail("bad input launched torchrun"))
    result = runner.invoke(app, [command, "--device", "cpu", "--model", "tiny", "--steps", "1", "--dataset-path",
                                 str(dataset), "--out", str(tmp_path / "runs")])
    assert words in one_line_error(result) and str(dataset) in result.stderr
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir()), "nothing is left behind"


def test_estimate_of_an_unreadable_model_directory_is_one_line_and_exit_2(tmp_path):
    (tmp_path / "config.json").write_text('{"model_type": "no-such-architecture"}')
    assert "cannot read the model config" in one_line_error(runner.invoke(app, ["estimate", "--model", str(tmp_path)]))


def test_malformed_config_is_one_line_and_exit_2(tmp_path):
    broken = tmp_path / "broken.json"
    broken.write_text('{"zero_optimization": {"stage": 2,}')
    assert "is not valid JSON" in one_line_error(runner.invoke(app, ["compare", "--device", "cpu", "--config", str(broken)]))


def test_config_nano_refuses_is_one_line_and_exit_2(tmp_path):
    pytest.importorskip("zero_lab.nano.facade.official_config")
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 2, "no_such_key": 1}}))
    line = one_line_error(runner.invoke(app, ["compare", "--device", "cpu", "--config", str(bad)]))
    assert "no_such_key" in line and str(bad) in line, "names the user's file, not the scratch copy"


@pytest.mark.parametrize("command", [["run", "--impl", "nano"], ["run", "--impl", "official"], ["compare"],
                                     ["config", "official"]], ids=["run-nano", "run-official", "compare", "config-official"])
def test_a_config_value_of_the_wrong_type_is_one_line_and_exit_2(tmp_path, monkeypatch, command):
    from zero_lab.launch import torchrun_job

    config = tmp_path / "quoted.json"
    config.write_text(json.dumps({"train_micro_batch_size_per_gpu": "4", "zero_optimization": {"stage": 2}}))
    monkeypatch.setattr(torchrun_job.subprocess, "Popen", lambda *args, **kwargs: pytest.fail("bad input launched torchrun"))
    where = [str(config)] if command[0] == "config" else ["--model", "tiny", "--config", str(config)]
    line = one_line_error(runner.invoke(app, [*command, *where, "--device", "cpu"]))
    assert f"{config}: config field 'train_micro_batch_size_per_gpu' is '4'" in line, line


def test_parse_formats_map_seed_names_and_count_garbled_lines(tmp_path):
    ours, seed = tmp_path / "ours.log", tmp_path / "seed.log"
    ours.write_text(OUR_LOG)
    seed.write_text(SEED_LOG)
    result = runner.invoke(app, ["parse", str(ours), str(seed), "--format", "csv"])
    assert result.exit_code == 0, result.output
    header, *rows = result.stdout.strip().splitlines()
    assert header.startswith("log,step,loss,") and "alloc_max_mb" in header and "cuda_" not in header
    assert len(rows) == 3 and ",7340.5," in rows[2]
    assert "skipped 1 garbled line" in result.stderr
    payload = json.loads(runner.invoke(app, ["parse", str(ours), "--format", "json"]).stdout)
    assert payload["logs"][0]["skipped_lines"] == 1 and payload["logs"][0]["zero"]["impl"] == "nano"
    assert payload["logs"][0]["phases"] == [{"step": 2, "phase": "after_forward", "live_bytes": 4096, "peak_bytes": 8192}]
    table = runner.invoke(app, ["parse", str(seed)])
    assert table.exit_code == 0 and "7340.5" in table.stdout


def test_parse_csv_is_the_step_table_with_each_log_s_cell(tmp_path):
    ours = tmp_path / "ours.log"
    ours.write_text(OUR_LOG)
    result = runner.invoke(app, ["parse", str(ours), "--format", "csv"])
    assert result.exit_code == 0, result.output
    import pandas as pd

    steps = pd.read_csv(io.StringIO(result.stdout))
    assert steps.columns[-5:].tolist() == ["impl", "world_size", "stage", "precision", "offload"]
    assert steps[["step", "loss", "impl", "stage", "world_size"]].values.tolist() == [[1, 5.5, "nano", 2, 2],
                                                                                      [2, 5.4, "nano", 2, 2]]


def test_parse_parquet_round_trips_the_step_table(tmp_path):
    pytest.importorskip("pyarrow")
    import pandas as pd

    ours = tmp_path / "ours.log"
    ours.write_text(OUR_LOG)
    result = runner.invoke(app, ["parse", str(ours), "--format", "parquet"])
    assert result.exit_code == 0, result.output
    steps = pd.read_parquet(io.BytesIO(result.stdout_bytes))
    assert steps["loss"].tolist() == [5.5, 5.4] and steps["impl"].dtype == "category"
    assert steps["step"].dtype == "int64" and steps["stage"].dtype == "Int64"


def test_parse_parquet_without_pyarrow_names_the_package(tmp_path, monkeypatch):
    import importlib.util

    ours = tmp_path / "ours.log"
    ours.write_text(OUR_LOG)
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *rest: None if name == "pyarrow" else find_spec(name, *rest))
    line = one_line_error(runner.invoke(app, ["parse", str(ours), "--format", "parquet"]))
    assert "--format parquet needs the pyarrow package" in line and "pip install pyarrow" in line


def fake_run(directory, impl, alloc):
    directory.mkdir(parents=True)
    categories = {"parameters_bytes": 10 * 2**20, "optimizer_states_bytes": 20 * 2**20} if impl == "nano" else {}
    phases = [{"step": 2, "phase": phase, "live_bytes": live * 2**20, "peak_bytes": alloc * 2**20, **categories}
              for phase, live in (("after_forward", 90), ("after_backward", 60), ("after_step", 40))]
    write_json(directory / "summary.json", {
        "world_size": 2, "stage": 2, "impl": impl, "status": "ok", "steps": 2, "loss_last": 4.0,
        "alloc_max_mb": alloc, "peak_alloc_max_mb": alloc, "reserved_max_mb": 800.0, "peak_reserved_max_mb": 900.0,
        "step_ms": 10.0, "comm_mb": 6.0, "precision": "fp32", "params": 1000, "run_dir": str(directory),
        "predicted_peak_mb": 99.0, "peak_error_pct": 100.0 * (99.0 - alloc) / alloc, "phases": phases,
        "losses": {"1": 5.0, "2": 4.0}, "env": {"torch": "2.13.0"}, "config": {}, "zero": {}})


def test_report_writes_markdown_plots_and_github_step_summary(tmp_path, monkeypatch):
    fake_run(tmp_path / "compare" / "cells" / "w2-s2-nano", "nano", 110.0)
    fake_run(tmp_path / "compare" / "cells" / "w2-s2-official", "official", 100.0)
    fake_run(tmp_path / "compare" / "warmup" / "w2-s2-nano", "nano", 999.0)
    step_summary = tmp_path / "step_summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(step_summary))
    out = tmp_path / "reports" / "demo.md"
    result = runner.invoke(app, ["report", str(tmp_path / "compare"), "--out", str(out)])
    assert result.exit_code == 0, result.output
    text = out.read_text()
    assert "| alloc MB | 110.0 | 100.0 | +10.0 | +10.00 |" in text and "999" not in text, "warm-ups are left out"
    assert (out.parent / "demo-loss.png").stat().st_size > 0 and (out.parent / "demo-memory.png").stat().st_size > 0
    assert (out.parent / "demo-phases.png").stat().st_size > 0 and "![demo-phases.png](demo-phases.png)" in text
    assert "| 2 | 2 | nano | 110.0 | 110.0 | " in text and "| 99.0 | -10.0 |" in text  # predicted peak, error %
    assert step_summary.read_text().startswith(text)


@pytest.mark.parametrize("damage, words", [
    (lambda path: path.write_text(path.read_text()[:40]), "is not valid JSON"),
    (lambda path: path.write_bytes(b"\x89PNG\r\n\x1a\n\xff\xfe binary"), "is not UTF-8 text"),
    (lambda path: path.write_text("[]"), "holds a JSON list, not the object zero-lab writes"),
    (lambda path: path.write_text('{"note": 1}'), "is not a run's summary (no world_size, stage, impl, status)"),
], ids=["cut off", "binary", "a list", "not a summary"])
def test_report_on_a_damaged_summary_is_one_line_naming_the_file(tmp_path, damage, words):
    fake_run(tmp_path / "compare" / "cells" / "w2-s2-nano", "nano", 110.0)
    fake_run(tmp_path / "compare" / "cells" / "w2-s2-official", "official", 100.0)
    damaged = tmp_path / "compare" / "cells" / "w2-s2-official" / "summary.json"
    damage(damaged)
    line = one_line_error(runner.invoke(app, ["report", str(tmp_path / "compare"), "--out", str(tmp_path / "r.md")]))
    assert line.startswith(f"error: {damaged} {words}"), line
    assert not (tmp_path / "r.md").exists()


def test_parse_of_a_file_without_log_lines_says_so(tmp_path):
    binary, ours = tmp_path / "model.bin", tmp_path / "ours.log"
    binary.write_bytes(bytes(range(256)) * 16)
    ours.write_text(OUR_LOG)
    for format in ("table", "csv", "json"):
        result = runner.invoke(app, ["parse", str(ours), str(binary), "--format", format])
        assert f"no log lines found in {binary}" in one_line_error(result) and result.stdout == ""


def test_estimate_json_for_a_preset_counts_parameters():
    result = runner.invoke(app, ["estimate", "--model", "tiny", "--gpus", "1,2", "--stages", "1,2", "--dtype", "float32",
                                 "--format", "json"])
    assert result.exit_code == 0, result.output
    payload = json.loads(result.stdout)
    from zero_lab.workload.models import build_model

    assert payload["params"] == sum(p.numel() for p in build_model("tiny", seed=0).parameters()) and len(payload["rows"]) == 4
    assert payload["rows"][1]["official_estimator_mb"] is not None and payload["rows"][0]["official_estimator_mb"] is None


def test_estimate_with_offload_splits_device_and_host_bytes():
    """bf16 stage 2 with the optimizer offloaded keeps the 16-bit parameters on the device, as
    DeepSpeed's own cpu_offload estimator says; the 16 bytes per parameter of master, states and
    gradient partition go to the host, split between the ranks."""
    result = runner.invoke(app, ["estimate", "--model", "tiny", "--gpus", "2", "--offload", "optimizer",
                                 "--format", "json"])
    assert result.exit_code == 0, result.output
    payload = json.loads(result.stdout)
    rows = {row["stage"]: row for row in payload["rows"]}
    assert set(rows) == {1, 2, 3}, "by default every stage the offload applies to"
    params_mb = payload["params"] / 2**20
    assert rows[2]["nano_mb"] == pytest.approx(2 * params_mb, rel=1e-3)
    assert rows[2]["official_estimator_mb"] == pytest.approx(2 * params_mb, rel=1e-6)
    assert rows[2]["nano_host_mb"] == pytest.approx(16 * params_mb / 2, rel=1e-3)
    assert rows[3]["nano_mb"] is not None and rows[3]["nano_mb"] < rows[2]["nano_mb"], "stage 3 also shards the parameters"


def test_estimate_offload_at_a_stage_it_does_not_apply_to_is_one_line_and_exit_2():
    error = one_line_error(runner.invoke(app, ["estimate", "--model", "1B", "--offload", "param", "--stages", "2"]))
    assert "--offload param does not apply at stage 2" in error and "--stages 3" in error


def test_estimate_adds_activations_and_the_predicted_peak_for_a_micro_batch():
    from zero_lab.analysis.memory.activation_memory import activation_bytes, decoder_shape
    from zero_lab.analysis.memory.estimate import MIB

    def rows(*extra):
        result = runner.invoke(app, ["estimate", "--model", "tiny", "--gpus", "2", "--stages", "0,3", "--dtype", "float32",
                                     "--format", "json", *extra])
        assert result.exit_code == 0, result.output
        return json.loads(result.stdout)["rows"]

    small, large = rows("--seq-len", "64", "--micro-batch", "2"), rows("--seq-len", "64", "--micro-batch", "8")
    expected = activation_bytes(decoder_shape("tiny"), 64, 2, "fp32").saved / MIB
    assert small[0]["activations_mb"] == pytest.approx(expected) and large[0]["activations_mb"] > 3 * expected
    assert all(row["predicted_peak_mb"] > row["activations_mb"] for row in small)
    assert small[0]["predicted_peak_mb"] > small[1]["predicted_peak_mb"]  # stage 3 shards the model states
    eager = rows("--seq-len", "64", "--micro-batch", "2", "--attn-impl", "eager")
    assert eager[0]["activations_mb"] > small[0]["activations_mb"]
    counted = runner.invoke(app, ["estimate", "--model", "600M", "--gpus", "1", "--stages", "2", "--format", "json"])
    assert json.loads(counted.stdout)["rows"][0]["predicted_peak_mb"] is None  # a bare count has no architecture


@pytest.mark.parametrize("arguments, words", [
    (["--seq-len", "1"], "--seq-len 1 is below 2"),
    (["--micro-batch", "0"], "--micro-batch 0 is below 1"),
    (["--attn-impl", "flash"], "--attn-impl flash is not one of sdpa, eager, flash_attention_2"),
])
def test_estimate_refuses_a_micro_batch_it_cannot_size(arguments, words):
    assert words in one_line_error(runner.invoke(app, ["estimate", "--model", "tiny", *arguments]))


def test_config_official_prints_a_config_deepspeed_accepts(tmp_path):
    pytest.importorskip("zero_lab.nano.facade.official_config")
    nano = tmp_path / "nano.json"
    nano.write_text(json.dumps({"train_micro_batch_size_per_gpu": 2, "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
                                "zero_optimization": {"stage": 2}}))
    result = runner.invoke(app, ["config", "official", str(nano), "--device", "cpu"])
    assert result.exit_code == 0, result.output
    official = json.loads(result.stdout)
    assert official["zero_optimization"]["stage"] == 2 and official["optimizer"]["params"]["torch_adam"] is True


def test_config_paths_in_cli_docstrings_and_docs_exist():
    import re

    texts = [path.read_text() for path in [*(REPO / "zero_lab" / "cli").glob("*.py"), REPO / "docs" / "cli.md"]]
    cited = {match for text in texts for match in re.findall(r"harness/configs/[\w.]+\.json", text)}
    assert cited and all((REPO / path).is_file() for path in cited), cited


def test_flags_click_cannot_parse_are_one_line_with_exit_2():
    import subprocess
    import sys
    from pathlib import Path
    zero_lab = str(Path(sys.executable).with_name("zero-lab"))
    for argv in (["run", "--steps", "abc"], ["no-such-command"], ["compare", "--no-such-flag"]):
        finished = subprocess.run([zero_lab, *argv], capture_output=True, text=True)
        assert finished.returncode == 2, argv
        assert finished.stderr.startswith("error: ") and finished.stderr.count("\n") == 1, finished.stderr
    assert subprocess.run([zero_lab], capture_output=True, text=True).returncode == 0  # bare: the help


@pytest.mark.parametrize("inter_bytes, split", [([2**20, 2**20, 3 * 2**20, 2**20], True), ([0, 0, 0], False)],
                         ids=["two nodes", "one node"])
def test_compares_console_runs_table_splits_the_wire_bytes_by_node_only_across_nodes(monkeypatch, inter_bytes, split):
    """The runs table `compare` prints (the done-when command's nano-alone run, W=4), at the width
    off a terminal: with `--ranks-per-node 2` the intra- and inter-node wire MB per step follow the
    wire MB, and no cell is cut to make room; with one node the columns are as before."""
    from rich.console import Console

    from tests.analysis.node_runs import RUN_COLUMNS, nodes_summaries
    from zero_lab.analysis.compare.comparison import build_comparison
    from zero_lab.cli import compare_cmd, output

    console = Console(file=io.StringIO(), width=output.stdout.width, soft_wrap=True, color_system=None)
    monkeypatch.setattr(output, "stdout", console)
    summaries = nodes_summaries(inter_bytes)
    compare_cmd.show(build_comparison(summaries, ["nano"]), summaries, "table")
    lines = console.file.getvalue().splitlines()
    lines = lines[[line.strip() for line in lines].index("runs") + 1:]
    header_lines = lines[1:next(index for index, line in enumerate(lines) if line.startswith("┡"))]
    columns = zip(*([cell.strip() for cell in line.strip("┃").split("┃")] for line in header_lines))
    headers = [" ".join(word for word in column if word) for column in columns]
    row = [cell.strip() for cell in lines[len(header_lines) + 2].strip("│").split("│")]
    expected = [cell.strip() for cell in RUN_COLUMNS.strip("| ").split("|")]
    values = ["4", "3", "nano", "PartitionedAdam", "ok", "4" if split else "3", "2.000000" if split else "3.000000",
              "5.0", "30.0", "100.0"]
    if split:
        assert headers == [*expected, "intra-node wire MB / step", "inter-node wire MB / step"], headers
        assert row == [*values, "4.00", "3.00", "2.00", "1.00"], row  # comm, wire = intra + inter
    else:
        assert headers == expected and row == [*values, "4.00", "3.00"], (headers, row)


def commands_of(group, path=()) -> list[tuple[tuple[str, ...], object]]:
    """(argv path, click command) of every command under the app (Typer may carry its own Click, so a
    group is told by its sub-commands)."""
    if not hasattr(group, "commands"):
        return [(path, group)]
    return [found for name, command in group.commands.items() for found in commands_of(command, (*path, name))]


def test_every_bracketed_word_of_an_options_help_is_printed_by_help():
    """Rich reads `[zero]` in a help text as markup and prints nothing for it (`exec --help` once
    printed "(, , , , ;"): a bracket meant to be read is escaped, `\\[zero]`."""
    import typer

    checked = 0
    for path, command in commands_of(typer.main.get_command(app)):
        shown = runner.invoke(app, [*path, "--help"], terminal_width=1000, env={"COLUMNS": "1000"}).output
        shown = " ".join(shown.replace("│", " ").split())
        for parameter in command.params:
            for word in re.findall(r"\\?\[([^\]\[]+)\]", getattr(parameter, "help", None) or ""):
                checked += 1
                assert f"[{word}]" in shown, f"zero-lab {' '.join(path)} --help drops [{word}] of {parameter.name}'s help"
    assert checked >= 5, "the help texts still hold bracketed words (exec's log contract, --stall-timeout's [opt_step])"


def test_attention_and_checkpointing_flags_reach_the_launched_workload(tmp_path, monkeypatch):
    from zero_lab.cli import jobs

    launched = []
    monkeypatch.setattr(jobs, "run_jobs", lambda prepared, environment: launched.extend(prepared) or ([], None))
    for command in (["run", "--gpus", "2"], ["compare", "--gpus", "2", "--stages", "2"]):
        launched.clear()
        runner.invoke(app, [*command, "--device", "cpu", "--model", "tiny", "--steps", "1", "--attn-impl", "eager",
                            "--gradient-checkpointing", "--out", str(tmp_path / command[0])])
        assert launched and all((job.spec.workload.attn_impl, job.spec.workload.gradient_checkpointing) == ("eager", True)
                                for job in launched), command
    bad = runner.invoke(app, ["run", "--device", "cpu", "--model", "tiny", "--attn-impl", "flash", "--out", str(tmp_path)])
    assert "--attn-impl flash is not one of sdpa, eager, flash_attention_2" in one_line_error(bad)
    script = runner.invoke(app, ["compare", "--device", "cpu", "--script", str(REPO / "examples" / "hf_trainer.py"),
                                 "--gradient-checkpointing"])
    assert "--gradient-checkpointing does not apply with --script" in one_line_error(script)


@pytest.mark.parametrize("cuda, noted", [([], True), (["NVIDIA H100"], False)])
def test_device_auto_says_in_one_line_when_it_falls_back_to_the_cpu(tmp_path, monkeypatch, cuda, noted):
    from zero_lab.cli import environment, jobs, preflight

    monkeypatch.setattr(environment, "cuda_devices", lambda: cuda)
    monkeypatch.setattr(jobs, "run_jobs", lambda prepared, env: ([], None))
    monkeypatch.setattr(preflight, "check", lambda *args: None)  # no GPU here to ask for free memory
    for command in (["run"], ["compare", "--stages", "2"]):
        result = runner.invoke(app, [*command, "--gpus", "1", "--model", "tiny", "--steps", "1", "--out", str(tmp_path / command[0])])
        notes = [line for line in result.stderr.splitlines() if line.startswith("note: --device auto")]
        assert notes == ([environment.AUTO_ON_CPU_NOTE] if noted else []), result.stderr
    bad = runner.invoke(app, ["compare", "--stages", "7"])  # bad input stays one line: the note waits for a launch
    assert "note:" not in bad.stderr and bad.exit_code == 2
    explicit = runner.invoke(app, ["run", "--device", "cpu", "--gpus", "1", "--model", "tiny", "--steps", "1",
                                   "--out", str(tmp_path / "explicit")])
    assert "--device auto" not in explicit.stderr


def test_docs_quote_the_device_auto_note_as_printed():
    from zero_lab.cli.environment import AUTO_ON_CPU_NOTE

    quoted = re.search(r"\(`(note: --device auto[^`]*?) \.\.\.`\)", " ".join((REPO / "docs" / "cli.md").read_text().split()))
    assert quoted and AUTO_ON_CPU_NOTE.startswith(quoted[1]), quoted


def test_exec_says_where_device_auto_runs_before_it_hands_over():
    import subprocess
    import sys

    from zero_lab.cli.environment import AUTO_ON_CPU_NOTE, cuda_devices

    entry = "import sys; sys.argv = ['zero-lab', 'exec', '--', 'true']; from zero_lab.cli.entry import main; main()"
    done = subprocess.run([sys.executable, "-c", entry], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert done.returncode == 0, done.stderr
    assert done.stderr.splitlines() == ([] if cuda_devices() else [AUTO_ON_CPU_NOTE])
