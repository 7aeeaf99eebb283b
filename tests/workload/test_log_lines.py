"""Contract lines format and parse back to the same values."""

import math

from zero_lab.workload.log_contract.log_lines import format_line, parse_line


def test_opt_step_line_round_trips_with_nine_significant_digits():
    line = format_line("opt_step", {"loss": 5.532322654321, "grad_norm": math.nan, "lr": 2e-4,
                                    "alloc_max_mb": 8.154296875, "comm_bytes": 6835208}, step=3)
    assert line.startswith("[opt_step 3] loss=5.53232265 grad_norm=nan lr=0.0002 ")
    tag, step, fields = parse_line(line)
    assert (tag, step) == ("opt_step", 3)
    assert abs(fields["loss"] - 5.532322654321) < 1e-8
    assert math.isnan(fields["grad_norm"]) and fields["comm_bytes"] == 6835208
    assert fields["alloc_max_mb"] == 8.1543


def test_header_values_keep_their_types_and_lose_their_spaces():
    line = format_line("zero", {"impl": "nano", "overlap_comm": False, "name": "my model"})
    assert line == "[zero] impl=nano overlap_comm=false name=my_model"
    assert parse_line(line) == ("zero", None, {"impl": "nano", "overlap_comm": False,
                                               "name": "my_model"})


def test_other_lines_are_not_contract_lines():
    for noise in ("[2026-11-29 15:51:58,783] [WARNING] [lr_schedules.py:759:get_lr] Attempting",
                  "W1129 torch/distributed/run.py:874] ****", "[opt_step 2] loss", ""):
        assert parse_line(noise) is None
