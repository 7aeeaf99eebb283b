"""The DataFrame API (zero_lab.load_steps, load_phases, load_runs, load_comparison) on the recorded
comparison in tests/fixtures/compare-tiny, checked against the rank-0 logs and summary.json files it
was made of, read without pandas."""

import json
import shutil

import pandas as pd
import pytest

import zero_lab
from tests.analysis import golden_cases as cases
from zero_lab.analysis.runs.logparse import MEMORY_FIELDS, parse_file
from zero_lab.analysis.runs.tables import CELL_COLUMNS

CELLS = sorted((cases.COMPARE_DIR / "cells").iterdir())


def test_load_steps_of_a_compare_directory_has_one_row_per_run_and_step():
    steps = zero_lab.load_steps(cases.COMPARE_DIR)
    assert len(steps) == sum(len(parse_file(cell / "logs" / "rank0.stdout.log").steps) for cell in CELLS) == 18
    assert list(steps.columns[:9]) == ["run", *CELL_COLUMNS, "step", "loss", "grad_norm"]
    for name in ("step_ms", "comm_mb", "comm_wire_mb", *MEMORY_FIELDS):
        assert steps[name].dtype == "float64", name
    assert steps["step"].dtype == "int64" and steps["stage"].dtype == "Int64" and steps["impl"].dtype == "category"
    assert steps["comm_bytes"].dtype == "Int64" and steps["offload"].dtype == "category"
    first = parse_file(CELLS[0] / "logs" / "rank0.stdout.log").steps[0]
    row = steps.iloc[0]
    assert (row["run"], row["impl"], row["world_size"], row["stage"]) == (str(CELLS[0]), "nano", 2, 1)
    assert (row["precision"], row["offload"]) == ("fp32", "none")
    assert row["loss"] == first["loss"] and row["peak_alloc_max_mb"] == first["peak_alloc_max_mb"]


def test_the_done_when_line_gives_the_last_loss_per_impl_and_stage():
    last = zero_lab.load_steps(str(cases.FIXTURES / "compare-*")).groupby(["impl", "stage"]).loss.last()
    expected = {(s["impl"], s["stage"]): s["loss_last"] for s in cases.recorded_summaries()}
    assert last.to_dict() == expected and len(expected) == 6


def test_rank_logs_run_directories_and_globs_name_the_same_steps():
    by_log = zero_lab.load_steps([cell / "logs" / "rank0.stdout.log" for cell in CELLS])
    by_directory = zero_lab.load_steps(str(cases.COMPARE_DIR / "cells" / "w2-s*"))
    columns = ["impl", "world_size", "stage", "precision", "offload", "step", "loss", "alloc_max_mb"]
    pd.testing.assert_frame_equal(by_log[columns].astype(str), by_directory[columns].astype(str))


def test_load_phases_keeps_every_phase_sample():
    phases = zero_lab.load_phases(CELLS[0])
    assert len(phases) == len(parse_file(CELLS[0] / "logs" / "rank0.stdout.log").phases) == 9
    assert list(phases["phase"].unique()) == ["after_forward", "after_backward", "after_step"]
    assert phases["live_bytes"].dtype == "Int64" and phases["parameters_bytes"].notna().all()


def test_load_runs_summarizes_like_summary_json():
    runs = zero_lab.load_runs(cases.COMPARE_DIR)
    recorded = {str(cell): json.loads((cell / "summary.json").read_text()) for cell in CELLS}
    assert list(runs["run"]) == list(recorded)
    for row in runs.to_dict("records"):
        summary = recorded[row["run"]]
        for name in ("steps", "loss_last", *MEMORY_FIELDS, "step_ms", "comm_mb", "comm_wire_mb", "tokens_per_s"):
            assert row[name] == summary[name], (row["run"], name)
        assert row["status"] == "ok"


def test_a_run_without_steps_keeps_its_row(tmp_path):
    cell = shutil.copytree(CELLS[0], tmp_path / "w2-s1-nano")
    (cell / "logs" / "rank0.stdout.log").write_text("[zero] impl=nano stage=1 world_size=2\n")
    runs = zero_lab.load_runs(cell)
    assert runs["steps"].tolist() == [0] and runs["loss_last"].isna().all() and runs["impl"].tolist() == ["nano"]
    assert len(zero_lab.load_steps(cell)) == 0


def test_load_comparison_is_what_compare_saved():
    runs, deltas = zero_lab.load_comparison(cases.COMPARE_DIR)
    saved = json.loads((cases.COMPARE_DIR / "compare.json").read_text())
    assert len(runs) == len(saved["rows"]) and len(deltas) == len(saved["deltas"]) == 3
    assert list(runs["run"]) == [str(cell) for cell in CELLS]
    assert deltas["alloc_max_mb_delta"].tolist() == [d["alloc_max_mb_delta"] for d in saved["deltas"]]
    assert deltas["stage"].dtype == "Int64" and runs["status"].dtype == "category"
    steps = zero_lab.load_steps(cases.COMPARE_DIR)
    assert set(runs["run"]) == set(steps["run"]), "runs join the step table on `run`"


def test_paths_that_name_nothing_say_so(tmp_path):
    with pytest.raises(FileNotFoundError, match="matches no file or directory"):
        zero_lab.load_steps(str(tmp_path / "compare-*"))
    with pytest.raises(ValueError, match="is neither a run directory"):
        zero_lab.load_steps(tmp_path)
    with pytest.raises(FileNotFoundError, match="has no compare.json"):
        zero_lab.load_comparison(tmp_path)


def test_a_bare_log_takes_its_cell_from_its_own_headers(tmp_path):
    log = tmp_path / "rank0.log"
    log.write_text("[default0]:[zero] impl=official stage=3 world_size=4 offload_optimizer=cpu offload_param=none\n"
                   "[default0]:[model] name=tiny ds_precision=bf16\n"
                   "[default0]:[opt_step 1] loss=5.5 alloc_max_mb=20.0\n")
    row = zero_lab.load_steps(log).iloc[0]
    assert (row["impl"], row["stage"], row["world_size"], row["precision"], row["offload"]) == (
        "official", 3, 4, "bf16", "optimizer")


def test_the_seed_s_log_reads_into_our_columns_with_an_unknown_cell(tmp_path):
    log = tmp_path / "nano-node2.log"
    log.write_text("[opt_step 1] loss=2.3 cuda_alloc_max_mb=7340.5 cuda_peak_alloc_max_mb=10260.2\n"
                   "[opt_step 2] loss=2.2 cuda_alloc_max_mb=7341.5\n")
    runs = zero_lab.load_runs(log)
    assert runs[["steps", "loss_last", "alloc_max_mb", "peak_alloc_max_mb"]].values.tolist() == [[2, 2.2, 7341.5, 10260.2]]
    assert runs[["impl", "stage", "world_size"]].isna().all(axis=None) and "cuda_alloc_max_mb" not in runs.columns
