"""The doctor's findings as pure functions over run data, without a launch: the recorded comparison
(tests/fixtures/compare-tiny), flight records written here, and steps whose causes the real runs of
test_findings_from_runs.py do not reach (gradients or a schedule that part). Also the CLI's contract:
the JSON shape, the exit codes, bad paths."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
from typer.testing import CliRunner

from zero_lab.analysis.memory.activation_memory import decoder_shape
from zero_lab.analysis.diagnosis import comparison, diagnose, killed, memory, mismatch, stage3
from zero_lab.analysis.diagnosis.finding import SEVERITY_OF, Finding, exit_code, ordered
from zero_lab.analysis.diagnosis.run_data import load_run
from zero_lab.analysis.runs.logparse import ParsedLog
from zero_lab.analysis.memory.peak_memory import predict_run_peak
from zero_lab.cli.app import app
from zero_lab.workload.meters.collective_record import CollectiveRecord, read_records

REPO = Path(__file__).resolve().parents[2]
COMPARE = REPO / "tests" / "fixtures" / "compare-tiny"
CODES = {"stage3-everything-gathered": "info", "buckets-dominate": "info", "dtype-difference": "info",
         "estimate-gap": "warning", "materialized-before-partition": "warning", "no-16bit-weights-on-save": "warning",
         "collective-mismatch": "error", "rank-killed": "error", "run-failed": "error", "loss-divergence": "error",
         "out-of-memory": "error",
         "rank-restarted": "info", "restart-not-reproduced": "warning"}


def test_the_codes_and_severities_are_the_contract():
    assert SEVERITY_OF == CODES


def test_errors_come_first_and_decide_the_exit_code():
    info = Finding("buckets-dominate", "t", [], "c", "f")
    error = Finding("loss-divergence", "t", [], "c", "f")
    assert ordered([info, error]) == [error, info]
    assert (exit_code([info]), exit_code([info, error]), exit_code([])) == (0, 1, 0)
    assert set(error.to_json()) >= {"code", "severity", "title", "evidence", "cause", "fix"}


def write_calls(directory: Path, rank: int, calls: list[tuple]) -> None:
    record = CollectiveRecord.open(directory, rank, 2)
    for op, payload, step, call, label in calls:
        record.returned(record.started(op, payload, payload // 2, "float32", str(payload // 4), 2, step, call, label))
    record.close()


def test_the_first_call_where_the_ranks_part_and_a_rank_that_went_on_alone(tmp_path):
    common = [("all_gather", 64, 1, "forward", "unit a"), ("reduce_scatter", 64, 1, "backward", "bucket 0[0:16)")]
    write_calls(tmp_path, 0, common + [("all_reduce", 4, 1, "step", "unscale_clip")])
    write_calls(tmp_path, 1, common)
    seq, calls = mismatch.first_difference(read_records(tmp_path))
    assert seq == 2 and calls[1] is None and calls[0].label == "unscale_clip"
    write_calls(tmp_path, 1, common + [("barrier", 0, 1, "between steps", "")])
    seq, calls = mismatch.first_difference(read_records(tmp_path))
    assert seq == 2 and "some ranks did work between steps" in mismatch.likely_cause(calls)


def test_records_that_agree_give_no_difference(tmp_path):
    for rank in (0, 1):
        write_calls(tmp_path, rank, [("all_gather", 64, 1, "forward", "unit a")] * 3)
    assert mismatch.first_difference(read_records(tmp_path)) is None


def killed_run(tmp_path, exit_code: int, second_rank_calls: list[tuple], failed_rank=1, said: str = ""):
    """A failed run whose rank 0 went on to an all-reduce and whose rank 1 issued `second_rank_calls`."""
    common = [("all_gather", 64, 1, "forward", "unit a"), ("reduce_scatter", 64, 1, "backward", "bucket 0[0:16)")]
    logs = tmp_path / "logs"
    logs.mkdir(parents=True)
    write_calls(logs, 0, common + [("all_reduce", 4, 1, "step", "unscale_clip")])
    write_calls(logs, 1, common + second_rank_calls)
    if said:
        (logs / "rank1.stderr.log").write_text(said)
    summary = {"status": "failed", "rank_exit_code": exit_code, "failed_rank": failed_rank, "impl": "nano",
               "stage": 2, "world_size": 2}
    (tmp_path / "summary.json").write_text(json.dumps(summary))
    return load_run(tmp_path)


def test_a_rank_killed_from_outside_is_no_collective_mismatch(tmp_path):
    run = killed_run(tmp_path, -9, [])  # rank 1's record stops: it was killed, it called nothing else
    assert mismatch.collective_mismatch(run) == []
    (finding,) = killed.rank_killed(run)
    assert finding.code == "rank-killed" and finding.title == "nano stage 2 (W=2): rank 1 was killed from outside (SIGKILL)"
    assert "at call 2 rank 1 issued nothing, and the others:" in " ".join(finding.evidence)
    assert "out-of-memory killer" in finding.cause and "--save-every" in finding.fix


def test_a_rank_out_of_memory_is_neither_a_kill_from_outside_nor_a_mismatch(tmp_path):
    run = killed_run(tmp_path, -9, [])
    run = replace(run, summary={**run.summary, "failure": "out_of_memory"})  # the harness saw it over the limit
    assert mismatch.collective_mismatch(run) == [] and killed.rank_killed(run) == []


def test_a_rank_that_stopped_in_a_stall_is_no_mismatch_and_the_stall_is_the_error(tmp_path):
    run = killed_run(tmp_path, -9, [])
    summary = {**run.summary, "status": "stalled", "rank_exit_code": None,
               "error": "stalled: rank 1 logged nothing for 20 s (its last: step 3)"}
    (tmp_path / "summary.json").write_text(json.dumps(summary))
    run = load_run(tmp_path)
    assert mismatch.collective_mismatch(run) == [] and killed.rank_killed(run) == []
    [finding] = [finding for finding in diagnose([tmp_path]) if finding.severity == "error"]
    assert finding.code == "run-failed" and "stalled: rank 1 logged nothing" in finding.title


def test_ranks_that_called_different_collectives_are_a_mismatch_even_when_one_was_killed(tmp_path):
    run = killed_run(tmp_path, -9, [("barrier", 0, 1, "between steps", "")])
    assert killed.rank_killed(run) == [] and [f.code for f in mismatch.collective_mismatch(run)] == ["collective-mismatch"]


def test_gloos_abort_on_a_mismatch_is_no_kill_from_outside(tmp_path):
    said = "terminate called ... Is there a distributed collective mismatch in your code?"
    run = killed_run(tmp_path / "abort", -6, [], said=said)  # SIGABRT: gloo's own
    assert killed.rank_killed(run) == [] and [f.code for f in mismatch.collective_mismatch(run)] == ["collective-mismatch"]
    run = killed_run(tmp_path / "kill", -9, [], said=said)
    assert killed.rank_killed(run) == [] and [f.code for f in mismatch.collective_mismatch(run)] == ["collective-mismatch"]


def fixture_run(cell: str):
    return load_run(COMPARE / "cells" / cell)


def with_steps(run, rows: list[dict]):
    log = replace(run.log, steps=[{"step": step, **row} for step, row in enumerate(rows, 1)])
    return replace(run, log=log)


def test_gradients_that_part_before_the_losses_point_at_the_reduction():
    reference = fixture_run("w2-s2-nano")
    same = {"lr": 1e-3, "grad_norm": 2.0}
    ours = with_steps(reference, [{"loss": 5.0, **same}, {"loss": 4.0, "lr": 1e-3, "grad_norm": 2.5}, {"loss": 3.5, **same}])
    theirs = with_steps(reference, [{"loss": 5.0, **same}, {"loss": 4.0, **same}, {"loss": 3.0, **same}])
    [finding] = comparison.loss_divergence(theirs, ours, 1e-4)
    assert finding.figures["step"] == 3 and finding.figures["gradients_parted_at"] == 2
    assert "gradient reduction" in finding.cause
    # `lr` is logged after the step: the rate of the next update. Update 2 at 2e-3 parts step 3's loss
    schedule = with_steps(reference, [{"loss": 5.0, "lr": 2e-3, "grad_norm": 2.0}, {"loss": 4.0, **same},
                                      {"loss": 3.5, **same}])
    [finding] = comparison.loss_divergence(theirs, schedule, 1e-4)
    assert finding.figures["learning_rate_parted_at"] == 2
    assert finding.cause.startswith("the learning rate of step 2's update differed (0.002 against 0.001)")
    # a rate logged after step 2 is update 3's, which no loss up to step 3 shows: not the cause
    late = with_steps(reference, [{"loss": 5.0, **same}, {"loss": 4.0, "lr": 2e-3, "grad_norm": 2.0},
                                  {"loss": 3.5, **same}])
    [finding] = comparison.loss_divergence(theirs, late, 1e-4)
    assert finding.figures["learning_rate_parted_at"] is None and "the update did not" in finding.cause
    assert comparison.loss_divergence(theirs, theirs, 1e-4) == []
    unknown = with_steps(reference, [{"loss": 5.0, "lr": 1e-3, "grad_norm": float("nan")}] * 2
                         + [{"loss": 3.5, **same}])  # official's stage 0 logs no gradient norm
    [finding] = comparison.loss_divergence(theirs, unknown, 1e-4)
    assert finding.figures["gradients_parted_at"] is None and "the update did not" in finding.cause


def test_the_doctor_names_the_step_compares_divergence_names_nan_losses_included():
    """One rule finds where losses part (`compare.divergence.first_loss_step`): a NaN loss parts, on
    one side or on both, as a NaN gap never passes the verdict."""
    from zero_lab.analysis.compare.divergence import first_loss_step

    reference = fixture_run("w2-s2-nano")
    nan = float("nan")
    for ours_losses, their_losses in (([5.0, nan, 3.0], [5.0, nan, 3.0]), ([5.0, 4.0, nan], [5.0, 4.0, 3.0]),
                                      ([5.0, 4.5, 3.0], [5.0, 4.0, 3.0])):
        ours = with_steps(reference, [{"loss": loss, "lr": 1e-3, "grad_norm": 2.0} for loss in ours_losses])
        theirs = with_steps(reference, [{"loss": loss, "lr": 1e-3, "grad_norm": 2.0} for loss in their_losses])
        [finding] = comparison.loss_divergence(theirs, ours, 1e-4)
        compared = first_loss_step(dict(enumerate(ours_losses, 1)), dict(enumerate(their_losses, 1)), 1e-4)
        assert finding.figures["step"] == compared == 1 + next(
            index for index, (a, b) in enumerate(zip(ours_losses, their_losses)) if not abs(a - b) <= 1e-4)


def test_the_recorded_comparison_has_facts_only():
    """nano and official at stages 1-3 (fp32): official's 20,000,000-element buffers dominate its
    peaks (80,000,000 bytes at stages 1 and 2), and nothing is wrong."""
    findings = diagnose([COMPARE])
    assert {finding.severity for finding in findings} == {"info"}
    buckets = [finding for finding in findings if finding.code == "buckets-dominate"]
    assert [Path(finding.runs[0]).name for finding in buckets] == ["w2-s1-official", "w2-s2-official", "w2-s3-official"]
    assert [finding.figures["buffer_bytes"] for finding in buckets[:2]] == [20_000_000 * 4] * 2


def test_out_of_memory_gives_the_predicted_peak_of_each_remedy():
    run = fixture_run("w2-s1-nano")
    run.summary = {**run.summary, "status": "failed", "failure": "out_of_memory",
                   "error": "killed, most likely out of memory: rank 0 held 900 MB resident"}
    [finding] = memory.out_of_memory(run)
    model, zero = run.log.model, run.log.zero
    assert finding.evidence[0] == run.summary["error"]
    assert finding.figures["predicted_peak_bytes"] == predict_run_peak(model, zero, 1, "fp32", 2).peak
    assert finding.figures["remedies"] == {
        "--stage 2": predict_run_peak(model, {**zero, "stage": 2}, 2, "fp32", 2).peak,
        f"--batch-size {model['micro_batch'] // 2}": predict_run_peak(
            {**model, "micro_batch": model["micro_batch"] // 2}, zero, 1, "fp32", 2).peak,
        "--gradient-checkpointing": predict_run_peak({**model, "gradient_checkpointing": True}, zero, 1, "fp32", 2).peak}


def test_a_save_that_gathers_16bit_weights_is_no_finding():
    run = fixture_run("w2-s3-nano")
    run.log = replace(run.log, checkpoints=[{"action": "save", "step": 3, "tag": "global_step3", "bytes": 1, "files": 3}])
    [finding] = stage3.no_16bit_weights_on_save(run)
    assert finding.code == "no-16bit-weights-on-save"
    assert finding.evidence[0].startswith("stage3_gather_16bit_weights_on_model_save is not set in ")
    assert finding.evidence[0].endswith("(DeepSpeed's default: false)")
    # a nano checkpoint holds no zero_to_fp32.py (official copies it into the save directory): the fix says so
    assert "zero-lab checkpoint consolidate" in finding.fix and "zero_to_fp32.py" not in finding.fix
    run.config = {"zero_optimization": {"stage3_gather_16bit_weights_on_model_save": False}}
    assert stage3.no_16bit_weights_on_save(run)[0].evidence[0].startswith(
        "stage3_gather_16bit_weights_on_model_save is false in ")
    run.config = {"zero_optimization": {"stage3_gather_16bit_weights_on_model_save": True}}
    assert stage3.no_16bit_weights_on_save(run) == []


def test_a_trainer_save_without_the_16bit_gather_is_found_from_what_the_trainer_said(tmp_path):
    shutil.copytree(COMPARE / "cells" / "w2-s3-nano", tmp_path / "run")
    run = load_run(tmp_path / "run")
    assert stage3.no_16bit_weights_on_save(run) == []  # no save at all
    (tmp_path / "run" / "logs" / "rank0.stderr.log").write_text(
        "W1206 trainer.py:4167] stage3_gather_16bit_weights_on_model_save=false. Saving the full checkpoint instead, "
        "use zero_to_fp32.py to recover weights\n")
    [finding] = stage3.no_16bit_weights_on_save(load_run(tmp_path / "run"))
    assert finding.figures["trainer_saves"] and finding.figures["saves"] == 0
    assert any(line.startswith("rank 0 stderr (the Hugging Face Trainer's save_model)") for line in finding.evidence)


def test_deepspeeds_fetch_rule_judges_only_the_engines_that_follow_it():
    run = fixture_run("w2-s3-official")
    assert [finding.code for finding in stage3.everything_gathered(run)] == ["stage3-everything-gathered"]
    for impl in ("fsdp2", "yours"):  # FSDP2 gathers every block again in the backward; a user's engine: unknown
        assert stage3.everything_gathered(replace(run, summary={**run.summary, "impl": impl})) == []


def test_every_setting_offered_releases_layers_and_the_first_kept_releases_half():
    shape = decoder_shape("qwen3-0.6b")
    rules = stage3.fetch_rules(replace(fixture_run("w2-s3-nano"), log=ParsedLog()))  # DeepSpeed's defaults
    gathered = [stage3.layers_whole_after_forward(shape, changed) for _, changed in stage3.releasing_rules(shape, rules)]
    assert stage3.layers_whole_after_forward(shape, rules) == shape.layers > max(gathered)
    assert gathered[-1] == 0  # no prefetch: every layer goes after its use


runner = CliRunner()


def test_doctor_json_and_exit_codes():
    result = runner.invoke(app, ["doctor", str(COMPARE), "--format", "json"])
    assert result.exit_code == 0, result.output
    found = json.loads(result.stdout)["findings"]
    assert found and all(set(item) >= {"code", "severity", "title", "evidence", "cause", "fix"} for item in found)


def test_doctor_refuses_a_path_that_is_no_run(tmp_path):
    for path in (tmp_path, tmp_path / "missing"):
        result = runner.invoke(app, ["doctor", str(path)])
        assert result.exit_code == 2 and result.stderr.startswith("error: ") and "Traceback" not in result.output


@pytest.mark.parametrize("content, words", [("[]", "holds a JSON list"), ("", "is not valid JSON"),
                                            ('{"status": "ok"', "is not valid JSON")])
def test_a_summary_json_that_is_no_object_is_one_line_naming_the_file(tmp_path, content, words):
    (tmp_path / "summary.json").write_text(content)
    result = runner.invoke(app, ["doctor", str(tmp_path)])
    assert result.exit_code == 2 and "Traceback" not in result.output, result.output
    [line] = result.stderr.strip().splitlines()
    assert line.startswith("error: ") and str(tmp_path / "summary.json") in line and words in line


def test_how_a_run_ended_says_each_thing_once_and_who_exited():
    from zero_lab.analysis.runs.rundir import who_exited

    stalled = replace(fixture_run("w2-s2-nano"), summary={"status": "stalled", "error": "stalled: no [opt_step] progress"})
    assert stalled.ending() == "stalled: no [opt_step] progress"
    killed = replace(fixture_run("w2-s2-nano"), summary={"status": "failed", "rank_exit_code": -9, "failed_rank": None})
    assert killed.ending() == "failed: the launch (torchrun) exited with -9 (SIGKILL)"
    assert who_exited(1, -6) == "rank 1 exited with -6 (SIGABRT)" and who_exited(0, 1) == "rank 0 exited with 1"


@pytest.mark.parametrize("cell", ["w2-s1-nano", "w2-s3-official"])
def test_each_cell_of_the_recorded_comparison_prints_as_text(cell):
    result = runner.invoke(app, ["doctor", str(COMPARE / "cells" / cell)])
    assert result.exit_code == 0 and result.stdout.rstrip().splitlines()[-1].endswith("info")


def test_a_failed_run_that_no_rule_explains_is_still_an_error_with_its_last_words(tmp_path):
    shutil.copytree(COMPARE / "cells" / "w2-s2-nano", tmp_path / "run")
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    summary.update(status="failed", rank_exit_code=1, failed_rank=0,
                   log_tail="Traceback (most recent call last):\n  File \"train.py\"\nValueError: the script raised")
    (tmp_path / "run" / "summary.json").write_text(json.dumps(summary))
    [finding] = [finding for finding in diagnose([tmp_path / "run"]) if finding.severity == "error"]
    assert finding.code == "run-failed" and finding.title.endswith("failed: rank 0 exited with 1")
    assert "last words: ValueError: the script raised" in finding.evidence
    assert exit_code(diagnose([tmp_path / "run"])) == 1


def test_a_directory_whose_launcher_was_killed_is_read_as_an_unfinished_run(tmp_path):
    """`kill -9` of `zero-lab run` leaves the ranks' logs and flight records, and no summary.json."""
    shutil.copytree(COMPARE / "cells" / "w2-s2-nano", tmp_path / "run")
    (tmp_path / "run" / "summary.json").unlink()
    [finding] = [finding for finding in diagnose([tmp_path / "run"]) if finding.severity == "error"]
    assert finding.code == "run-failed" and "nano stage 2 (W=2): unfinished: the command that launched it ended " \
        "before it wrote summary.json" in finding.title
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="is neither a run directory"):
        diagnose([tmp_path / "empty"])


def test_one_impl_run_in_two_precisions_is_a_dtype_difference():
    fp32 = fixture_run("w2-s2-nano")
    bf16 = replace(fixture_run("w2-s2-nano"), summary={**fp32.summary, "precision": "bf16"},
                   log=replace(fp32.log, model={**fp32.log.model, "param_dtype": "torch.bfloat16",
                                                "compute_dtype": "torch.bfloat16", "ds_precision": "bf16"}))
    [finding] = comparison.dtype_difference([fp32, bf16])
    assert finding.title.startswith("nano fp32, nano bf16 hold parameters, stored")


def test_a_run_refused_for_bad_input_gets_no_finding_beside_its_one_line(tmp_path):
    shutil.copytree(COMPARE / "cells" / "w2-s2-nano", tmp_path / "run")
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    summary.update(status="bad_input", rank_exit_code=2, failed_rank=1, error="injected bad input. Fix it")
    (tmp_path / "run" / "summary.json").write_text(json.dumps(summary))
    assert [finding for finding in diagnose([tmp_path / "run"]) if finding.severity == "error"] == []
