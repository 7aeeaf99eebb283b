"""`zero-lab doctor RUN --plot FILE`: each rank's collectives, call by call, up to the call where they
part (analysis/report/schedule_plot.py), drawn from the flight records of a failed run written here."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from tests.diagnosis.test_findings import killed_run, write_calls
from zero_lab.analysis.report.picture import picture_data
from zero_lab.analysis.report.schedule_plot import WINDOW, picture_numbers
from zero_lab.cli.app import app
from zero_lab.workload.meters.collective_record import read_records

runner = CliRunner()
AGREED = [("all_gather", 64 * (index + 1), 1, "forward", f"unit m{index}") for index in range(8)]


def parted_run(tmp_path):
    """A failed run whose ranks agree on 8 gathers, then gather different units (rank 1 a smaller one)."""
    run = killed_run(tmp_path, -6, [])
    write_calls(tmp_path / "logs", 0, AGREED + [("all_gather", 512, 2, "forward", "unit head"),
                                                ("all_reduce", 4, 2, "step", "unscale_clip")])
    write_calls(tmp_path / "logs", 1, AGREED + [("all_gather", 256, 2, "forward", "unit vision")])
    return run


def test_the_picture_holds_each_ranks_calls_up_to_the_parting_one_and_none_after(tmp_path):
    parted_run(tmp_path)
    numbers = picture_numbers("nano stage 2 (W=2)", read_records(tmp_path / "logs"))
    assert numbers["parting"] == 8
    for rank, label, payload in (("0", "unit head", 512), ("1", "unit vision", 256)):
        calls = numbers["ranks"][rank]
        assert [call[0] for call in calls] == list(range(8 - WINDOW, 9)), "the window, then the parting call"
        assert calls[-1] == [8, "all_gather", payload, f"step 2 forward, {label}"]
        assert calls[:-1] == [[seq, "all_gather", 64 * (seq + 1), f"step 1 forward, unit m{seq}"]
                              for seq in range(8 - WINDOW, 8)]


def test_records_that_agree_draw_nothing(tmp_path):
    for rank in (0, 1):
        write_calls(tmp_path, rank, AGREED)
    assert picture_numbers("t", read_records(tmp_path)) is None


def test_doctor_plot_draws_the_parting_and_still_prints_the_findings(tmp_path):
    parted_run(tmp_path / "run")
    picture = tmp_path / "parting.png"
    result = runner.invoke(app, ["doctor", str(tmp_path / "run"), "--plot", str(picture), "--format", "json"])
    assert result.exit_code == 1, result.output  # the mismatch is an error
    assert [finding["code"] for finding in json.loads(result.stdout)["findings"]] == ["collective-mismatch"]
    assert picture_data(picture)["data"]["parting"] == 8


def test_doctor_plot_without_a_parting_or_without_runs_is_one_line_and_exit_2(tmp_path):
    (tmp_path / "run" / "logs").mkdir(parents=True)
    for rank in (0, 1):
        write_calls(tmp_path / "run" / "logs", rank, AGREED)
    (tmp_path / "run" / "summary.json").write_text(json.dumps({"status": "ok", "impl": "nano", "stage": 2,
                                                               "world_size": 2}))
    for argv in (["doctor", str(tmp_path / "run"), "--plot", str(tmp_path / "p.png")], ["doctor", "--plot", "p.png"]):
        result = runner.invoke(app, argv)
        assert result.exit_code == 2 and result.stderr.startswith("error: --plot") and "Traceback" not in result.output
        assert len(result.stderr.strip().splitlines()) == 1 and not (tmp_path / "p.png").exists()
