"""docs/log-format.md, docs/compare-json.md and docs/explain-json.md against what the code writes: every
tag, kind and key the code writes is documented, every documented one is written, and the log's example
is what the command it names prints."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from zero_lab.cli.app import app
from zero_lab.workload.log_contract.log_lines import TAGS, parse_line
from tests.docs.doc_text import REPO, read, table_after

LOG_FORMAT = read(REPO / "docs" / "log-format.md")
COMPARE_JSON = read(REPO / "docs" / "compare-json.md")
EXPLAIN_JSON = read(REPO / "docs" / "explain-json.md")
SOURCE = "\n".join(path.read_text() for path in (REPO / "zero_lab").rglob("*.py"))
ZERO_LAB = str(Path(sys.executable).with_name("zero-lab"))


def emitted_tags() -> set[str]:
    """The tags the harness emits (`emit(rank, "<tag>", ...)`), opt_step included."""
    return set(re.findall(r'emit\(rank, "(\w+)"', read(REPO / "zero_lab" / "harness" / "train.py")))


def test_the_documented_line_regex_keeps_exactly_the_contract_tags():
    documented = re.search(r"lines that match `([^`]+)`", LOG_FORMAT)[1]
    pattern = re.compile(documented)
    for tag in TAGS:
        line = f"[{tag} 3] loss=1" if tag == "opt_step" else f"[{tag}] key=1"
        assert pattern.match(line), f"the documented regex misses [{tag}]"
    assert not pattern.match("[unknown] key=1") and not pattern.match("W1129 12:00:00 warning")
    alternatives = set(re.search(r"\\\[\((.*?)\)\\\]", documented)[1].split("|"))
    assert {alternative.split(" ")[0] for alternative in alternatives} == set(TAGS)


def test_every_tag_the_harness_emits_has_its_section():
    headings = set(re.findall(r"^## `\[(\w+)", LOG_FORMAT, flags=re.M))
    assert emitted_tags() <= headings, emitted_tags() - headings


def test_every_warn_kind_is_documented_and_every_documented_kind_is_written():
    written = set(re.findall(r'"kind": "(\w+)"', SOURCE))
    section = LOG_FORMAT.split("## `[warn]`")[1].split("\n## ")[0]
    documented = set(re.findall(r"kind=(\w+)", section))
    assert written == documented, f"written only: {written - documented}; documented only: {documented - written}"


def table_keys(text: str, heading: str) -> set[str]:
    """The backticked keys of the first column of the table under a heading."""
    section = text.split(heading)[1].split("\n## ")[0]
    keys = set()
    for line in section.splitlines():
        if line.startswith("| `"):
            keys.update(re.findall(r"`([\w<>\[\].]+)`", line.split(" | ")[0]))
    return keys


def test_every_documented_log_key_is_written_somewhere():
    for heading in ("## `[rank]`", "## `[zero]`", "## `[model]`", "## `[opt_step k]`", "## `[phase]`"):
        for key in table_keys(LOG_FORMAT, heading) - {"<category>_bytes"}:
            assert re.search(rf"\b{key}\b", SOURCE), f"log-format.md documents {heading} {key}, which no code writes"


@pytest.mark.slow
def machine_free(line: str) -> str:
    """A line without the `[model]` line's device_name and rss_beside_tensors_mb, which name and measure the
    machine that ran it."""
    return re.sub(r" (device_name|rss_beside_tensors_mb)=\S+", "", line)


def test_the_example_is_what_its_command_prints_and_every_key_is_documented(tmp_path):
    section = LOG_FORMAT.split("## Example")[1]
    command = re.search(r"`(zero-lab run [^`]+)`", section)[1].split()[1:]
    example = re.search(r"```\n(.*?)```", section, flags=re.S)[1].splitlines()
    done = subprocess.run([ZERO_LAB, *command, "--out", str(tmp_path), "--name", "example"], capture_output=True,
                          text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-2000:]
    printed = [line for line in (tmp_path / "example" / "logs" / "rank0.stdout.log").read_text().splitlines()
               if parse_line(line)]
    for line in example:
        tag, step, fields = parse_line(line)
        same = [parse_line(other) for other in printed if parse_line(other)[0] == tag]
        if tag in ("zero", "model", "comm"):  # the same on every run (but the machine's name): the same line
            assert machine_free(line) in map(machine_free, printed), (
                f"the example's line is not what the command prints:\n{line}\n" + "\n".join(
                    other for other in printed if other.startswith(f"[{tag}]")))
        else:
            assert any(list(fields) == list(other[2]) for other in same), f"[{tag}]'s keys differ from a run's"
    documented = {heading: table_keys(LOG_FORMAT, heading) for heading in
                  ("## `[rank]`", "## `[zero]`", "## `[model]`", "## `[opt_step k]`", "## `[phase]`")}
    categories = re.compile(r"\w+_bytes$")
    for line in printed:
        tag, _, fields = parse_line(line)
        heading = {"opt_step": "## `[opt_step k]`"}.get(tag, f"## `[{tag}]`")
        if heading not in documented:
            continue
        undocumented = [key for key in fields if key not in documented[heading]
                        and not (tag == "phase" and categories.match(key))]
        assert not undocumented, f"[{tag}] writes keys log-format.md does not document: {undocumented}"


def compare_rows_written(tmp_path) -> list[dict]:
    """compare.json's rows as today's code writes them, from the recorded runs' logs."""
    from zero_lab.analysis.compare.comparison import SUMMARY_ONLY
    from zero_lab.cli import input_checks
    from zero_lab.launch import torchrun, torchrun_job

    rows = []
    for recorded in sorted((REPO / "tests" / "fixtures" / "compare-tiny" / "cells").iterdir()):
        run_dir = tmp_path / recorded.name
        shutil.copytree(recorded, run_dir)
        (run_dir / "console.log").write_text("")
        impl, stage = recorded.name.split("-")[2], int(recorded.name.split("-")[1][1:])
        spec = input_checks.make_spec(impl, stage, 2, "cpu", run_dir, torchrun.Workload(model="tiny", steps=3),
                              torchrun.MultiNode(), [])
        summary = torchrun_job.summarize(spec, run_dir, 0, None, 1.0)
        rows.append({key: value for key, value in summary.items() if key not in SUMMARY_ONLY})
    return rows


def test_every_compare_json_key_is_documented_and_every_documented_key_is_written(tmp_path):
    recorded = json.loads((REPO / "tests" / "fixtures" / "compare-tiny" / "compare.json").read_text())
    rows = compare_rows_written(tmp_path)
    documented_rows = table_keys(COMPARE_JSON, "## `rows[]`")
    written_rows = {key for row in rows for key in row}
    assert written_rows <= documented_rows, f"rows[] keys not in compare-json.md: {written_rows - documented_rows}"
    fields = ("alloc_max_mb", "peak_alloc_max_mb", "reserved_max_mb", "peak_reserved_max_mb")
    documented_deltas = {key.replace("<field>", field) for key in table_keys(COMPARE_JSON, "## `deltas[]`")
                         for field in fields}
    written_deltas = {key for delta in recorded["deltas"] for key in delta}
    assert written_deltas <= documented_deltas, written_deltas - documented_deltas
    documented_verdict = table_keys(COMPARE_JSON, "## `verdict`")
    assert set(recorded["verdict"]) <= documented_verdict, set(recorded["verdict"]) - documented_verdict
    top = set(re.findall(r'^  "(\w+)":', COMPARE_JSON, flags=re.M))
    assert set(recorded) == top, set(recorded) ^ top
    for key in (documented_rows - written_rows) | (documented_verdict - set(recorded["verdict"])):
        assert re.search(rf'"{key}"', SOURCE), f"compare-json.md documents {key}, which no code writes"


def key_paths(value, prefix: str = "") -> set[str]:
    """`moments[].total_bytes`-style paths of every key; a dict of categories (`bytes`) is a leaf."""
    paths = set()
    if isinstance(value, dict):
        for key, child in value.items():
            path = f"{prefix}{key}"
            paths.add(path)
            if key not in ("bytes", "device_bytes", "host_bytes"):
                paths |= key_paths(child, f"{path}.")
    elif isinstance(value, list) and value and isinstance(value[0], dict):
        prefix = prefix.rstrip(".") + "[]."
        for child in value:
            paths |= key_paths(child, prefix)
    return paths


def test_every_explain_json_key_is_documented_and_every_documented_key_is_written():
    runner = CliRunner()
    written = set()
    for stage in (0, 1, 2, 3):
        for offload in ("none", "param") if stage == 3 else ("none",):
            result = runner.invoke(app, ["explain", "--model", "tiny", "--stage", str(stage), "--gpus", "2",
                                         "--offload", offload, "--format", "json"])
            assert result.exit_code == 0, result.output
            written |= key_paths(json.loads(result.stdout))
    contract = EXPLAIN_JSON.split("## `--measure`")[0]
    documented = {path.replace("[]", "") if path.endswith("[]") else path
                  for path in re.findall(r"`([a-z_]+(?:\[\])?(?:\.[a-z_]+)*)`", contract)}
    leaves = {path.split(".")[-1] for path in documented}
    undocumented = {path for path in written if path not in documented and path.split(".")[-1] not in leaves}
    assert not undocumented, f"explain writes keys explain-json.md does not document: {undocumented}"
    table = {key.removesuffix("[]") for row in table_after(EXPLAIN_JSON, "## The contract")[1:]
             for key in re.findall(r"`([\w\[\].]+)`", row[0])}
    assert table <= written, f"explain-json.md documents keys explain does not write: {table - written}"
