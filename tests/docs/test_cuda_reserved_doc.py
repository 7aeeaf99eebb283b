"""docs/cli.md's figures on what CUDA's caching allocator reserves, against the tables they come from:
reports/cuda-reserved.md (bench/cuda_reserved.py: each cell's allocations replayed on CPU through the
allocator's rules) and the GPU reports it sets them beside."""

from __future__ import annotations

import re

from tests.cli.test_estimate_by_impl import measured_reserved
from zero_lab.analysis.memory.memory_fit import TIGHT_FRACTION
from tests.docs.doc_text import REPO, read
from tests.docs.test_gpu_report import runs

SECTION = read(REPO / "docs" / "cli.md").split("On a GPU the unit is", 1)[1].split("`zero-lab estimate` gives", 1)[0]
PROSE = re.sub(r"\s+", " ", SECTION)


def replay_rows() -> list[dict[str, str]]:
    lines = [line for line in read(REPO / "reports" / "cuda-reserved.md").splitlines() if line.startswith("|")]
    header = [cell.strip() for cell in lines[0].strip("|").split("|")]
    return [dict(zip(header, (cell.strip() for cell in line.strip("|").split("|")))) for line in lines[2:]]


def test_the_replay_is_within_the_stated_error_of_every_gpu_row_it_sits_beside():
    stated = float(re.search(r"the replay reserves within ([\d.]+)% of what the GPU reserved", PROSE).group(1))
    compared = [row for row in replay_rows() if row["GPU reserved MB"] != "-"]
    assert {(row["impl"], row["stage"]) for row in compared} == {(impl, stage) for impl in ("official", "fsdp2")
                                                                  for stage in ("2", "3")}
    for row in compared:
        assert float(row["GPU reserved MB"]) == measured_reserved("gpu-check.md", int(row["stage"]), row["impl"])
        assert float(row["GPU peak MB"]) == float(runs("gpu-check.md")[int(row["stage"]), row["impl"]]["peak alloc MB"])
        assert abs(float(row["replay error %"])) <= stated
    # the stated figure is the largest error, not a loose bound
    assert max(abs(float(row["replay error %"])) for row in compared) > stated - 0.5


def test_the_offload_rows_reserve_what_the_prose_says_beyond_officials_peak():
    low, high = map(float, re.search(r"the reports reserve ([\d.]+)-([\d.]+) x official's peak", PROSE).groups())
    ratios = [measured_reserved("gpu-check-offload.md", stage, "official")
              / float(runs("gpu-check-offload.md")[stage, "official"]["peak alloc MB"]) for stage in (2, 3)]
    assert (round(min(ratios), 1), round(max(ratios), 1)) == (low, high)


def test_the_estimate_error_the_prose_states_is_the_tests_bound():
    assert "the prediction is within 5% for official's and FSDP2's rows" in PROSE
    source = read(REPO / "tests" / "cli" / "test_estimate_by_impl.py")
    assert "abs(predicted - measured) / measured < 0.05" in source


def test_nanos_gap_is_what_its_replay_reserves_beyond_its_estimate():
    low, high = map(int, re.search(r"it reserves (\d+)-(\d+)% beyond its predicted peak", PROSE).groups())
    nano = [row for row in replay_rows() if row["impl"] == "nano"]
    gaps = [100 * (float(row["replayed reserved MB"]) - float(row["estimate MB"])) / float(row["estimate MB"])
            for row in nano]
    assert len(gaps) == 2 and (round(min(gaps)), round(max(gaps))) == (low, high)
    assert max(gaps) < 100 * TIGHT_FRACTION  # inside the preflight's band
