"""docs/fsdp2.md's measured numbers against the report they cite (reports/cpu-three-way.md): every
MB of its table is the report's, every bytes-per-parameter figure that MB over the small model's
parameters, and every number of "Which one should I pick" one of the table's or the report's."""

from __future__ import annotations

import re

from tests.docs.doc_text import REPO, read, table_after
from zero_lab.analysis.memory.activation_memory import decoder_shape
from zero_lab.analysis.memory.peak_memory import unit_parameters

DOC = read(REPO / "docs" / "fsdp2.md")
REPORT = read(REPO / "reports" / "cpu-three-way.md")
MEASURED = DOC[DOC.index("## Measured: small, W = 2, fp32"):DOC.index("## Collectives")]
PICK = DOC[DOC.index("## Which one should I pick"):]


def small_parameters() -> int:
    shape = decoder_shape("small")
    block, root = unit_parameters(shape)
    return shape.layers * block + root


def report_runs() -> dict[tuple[int, str], dict[str, str]]:
    """(stage, impl) -> the report's Runs row at world size 2, by header."""
    rows = table_after(REPORT, "## Runs")
    header = rows[0]
    return {(int(row[1]), row[2]): dict(zip(header, row)) for row in rows[1:] if row[0] == "2"}


def mb_and_per_parameter(cell: str) -> tuple[str, str]:
    found = re.fullmatch(r"([\d.]+) \(([\d.]+)\)", cell)
    assert found, cell
    return found[1], found[2]


def step_loss_gaps() -> list[float]:
    return [float(gap) for gap in re.findall(r"max step loss delta \w+ vs \w+ \|[ |]*\| ([\d.]+) \(parity\)", REPORT)]


def test_the_table_is_the_reports_runs_per_parameter():
    parameters = small_parameters()
    assert f"{parameters:,} parameters" in MEASURED and f"/ {parameters:,})" in MEASURED
    rows = table_after(MEASURED, "## Measured: small")
    assert rows[0][:2] == ["stage", "impl"] and len(rows) == 7
    runs = report_runs()
    assert sorted(runs) == sorted((int(row[0]), row[1]) for row in rows[1:])
    for stage, impl, after_step, peak, wire in rows[1:]:
        run = runs[(int(stage), impl)]
        for cell, column in ((after_step, "alloc MB"), (peak, "peak alloc MB"), (wire, "wire MB / step")):
            mb, per_parameter = mb_and_per_parameter(cell)
            assert mb == run[column], (stage, impl, column)
            assert float(per_parameter) == round(float(mb) * 2**20 / parameters, 1), (stage, impl, column)


def test_the_loss_gap_and_step_times_are_the_reports():
    gaps = step_loss_gaps()
    assert len(gaps) == 6, "three pairs at each of two stages"
    stated = f"{max(gaps):.1e}".replace("e-05", "e-5")
    assert f"largest per-step gap of any pair over 20 steps was {stated}" in " ".join(MEASURED.split())
    assert f"the largest per-step gap of any pair was {stated}" in " ".join(PICK.split())
    runs = report_runs()
    for stage in (2, 3):
        times = sorted(float(runs[(stage, impl)]["step ms"]) / 1000 for impl in ("nano", "official", "fsdp2"))
        assert f"{times[0]:.1f} to {times[-1]:.1f} s at stage {stage}" in " ".join(MEASURED.split())


def test_every_number_in_which_one_should_i_pick_is_measured():
    """The table's, or the bf16 paragraph's (tiny, W = 2), whose bytes per parameter are its MB
    over tiny's parameters."""
    table = set(re.findall(r"\d+\.\d+", MEASURED))
    bf16 = re.search(r"Live bytes between steps in that run: nano ([\d.]+) MB, FSDP2 ([\d.]+) MB \(([\d,]+) parameters: "
                     r"([\d.]+) and ([\d.]+) bytes per parameter", " ".join(DOC.split()))
    assert bf16, "the bf16 paragraph's measured bytes"
    nano_mb, fsdp2_mb, parameters, nano_per, fsdp2_per = bf16.groups()
    shape = decoder_shape("tiny")
    block, root = unit_parameters(shape)
    assert int(parameters.replace(",", "")) == shape.layers * block + root
    for mb, per in ((nano_mb, nano_per), (fsdp2_mb, fsdp2_per)):
        assert float(per) == round(float(mb) * 2**20 / int(parameters.replace(",", "")), 1), (mb, per)
    numbers = re.findall(r"(?<![\de.-])\d+\.\d+(?!\d)", PICK.replace("2.8e-5", ""))
    assert len(numbers) >= 10, numbers
    for number in numbers:
        assert number in table or number in (nano_per, fsdp2_per), number


def test_fsdp2s_predicted_peaks_are_stated_and_near_the_measured_ones():
    """The two predictions the text states are `fsdp2_peak`'s for the report's workload (2 ranks, fp32,
    micro-batch 4 of 128 tokens), each within 2% of the table's measured peak."""
    from zero_lab.analysis.memory.peak_memory import predict_peak

    runs = report_runs()
    for stage in (2, 3):
        predicted = predict_peak(decoder_shape("small"), stage, "fp32", 2, 128, 4, impl="fsdp2").peak / 2**20
        assert f"{predicted:.1f}" in MEASURED, predicted
        measured = float(runs[(stage, "fsdp2")]["peak alloc MB"])
        assert abs(predicted - measured) / measured < 0.02, (stage, predicted, measured)
