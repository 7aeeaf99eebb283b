"""The resident prediction against a real run where the heap's share is large: `zero-lab compare` on the
small model at stage 3, nano, 2 CPU ranks, 4 steps (about 70 s on 2 cores: the heap's share grows over
the first three steps, then holds; measured high-water marks 747, 936, 1,100, 1,118 MB). Its summary's
`predicted_resident_mb` (the tensors' predicted peak, what the heap keeps, and the rank's own reading
once its engine was built) is within the issue's 10% of the rank's resident high-water mark, and the heap's
share is too large to leave out (bench/peak_vs_predicted.py measures every stage and impl). A launch, not
a spawned world (tests/README.md, rule 2): what is measured is a launched rank's own resident set, and a
rank forked from the preloaded forkserver holds its parent's pages and heap too."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # launches torchrun

ZERO_LAB = str(Path(sys.executable).with_name("zero-lab"))


def test_a_stage_3_runs_resident_peak_is_predicted_within_10_percent_with_the_heaps_share(tmp_path):
    done = subprocess.run([ZERO_LAB, "compare", "--gpus", "2", "--device", "cpu", "--model", "small", "--steps", "4",
                           "--stages", "3", "--impls", "nano", "--format", "json", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    (row,) = json.loads(done.stdout)["rows"]
    measured, predicted = row["peak_reserved_max_mb"], row["predicted_resident_mb"]
    assert abs(row["resident_error_pct"]) < 10, (measured, predicted)
    heap = predicted - row["predicted_peak_mb"] - row["rss_beside_tensors_mb"]
    # what the steps added beside the live tensors and the process once built: the heap's, measured
    added = measured - row["peak_alloc_max_mb"] - row["rss_beside_tensors_mb"]
    # docs/cli.md: "about a quarter of a rank's resident peak"
    # (measured here 0.25 predicted, 0.27-0.28 measured; another machine's libraries move the second)
    assert 0.15 < heap / measured < 0.35 and 0.15 < added / measured < 0.35, (heap, added, measured)
