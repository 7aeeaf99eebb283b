"""`--check-collectives`: torch checks every collective across the ranks before it is issued
(TORCH_DISTRIBUTED_DEBUG=DETAIL), so the module one rank skips at stage 3 (examples/skipping_script.py)
stops both impls at their first divergent gather, an ordinary error on every rank instead of gloo's abort
or a hang; the doctor adds what torch saw and the line of the user's script that issued each rank's call."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.diagnosis.test_mismatch_e2e import compare_skipping  # the skipping script, nano and official at stage 3
from zero_lab.analysis.diagnosis.torch_check import issuing_frame, torch_check_lines

REPO = Path(__file__).resolve().parents[2]
ZERO_LAB = str(Path(sys.executable).with_name("zero-lab"))
SCRIPT = REPO / "examples" / "skipping_script.py"
TORCH_SAYS = ('RuntimeError: Detected mismatch between collectives on ranks. Rank 1 is running collective: '
              'CollectiveFingerPrint(SequenceNumber=14, OpType=_ALLGATHER_BASE, TensorShape=[528], TensorDtypes=Float, '
              'TensorDeviceTypes=TensorOptions(dtype=float (default), device=cpu)), but Rank 0 is running collective: '
              'CollectiveFingerPrint(SequenceNumber=14, OpType=_ALLGATHER_BASE, TensorShape=[1056], TensorDtypes=Float)')


def script_line(text: str) -> int:
    """The line of the skipping script that holds `text`."""
    return next(number for number, line in enumerate(SCRIPT.read_text().splitlines(), 1) if text in line)


def test_torchs_words_become_each_ranks_call_and_the_user_frame_that_issued_it():
    traceback = (f'[rank1]:   File "{SCRIPT}", line 44, in forward\n'
                 '[rank1]:   File "/venv/lib/python3.12/site-packages/torch/nn/modules/module.py", line 1778, in _call\n'
                 '[rank1]:   File "/work/zero_lab/nano/collectives.py", line 179, in all_gather_into_tensor\n')
    assert issuing_frame(traceback) == "skipping_script.py:44 in forward"
    assert issuing_frame(traceback.split("\n", 1)[1]) == "collectives.py:179 in all_gather_into_tensor"
    assert torch_check_lines({1: traceback + f"[rank1]: {TORCH_SAYS}\n", 0: "no check here"}) == [
        "rank 1 (torch's check, --check-collectives): collective 14, _ALLGATHER_BASE of [528] Float, "
        "issued at skipping_script.py:44 in forward"]


@pytest.fixture(scope="module")
def checked(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    out = tmp_path_factory.mktemp("checked")
    return out / "check", compare_skipping(out, "check", "--check-collectives")


@pytest.mark.slow
@pytest.mark.official
def test_a_skipped_module_stops_both_impls_with_torchs_error_not_an_abort(checked):
    compare_dir, done = checked
    assert done.returncode == 3, done.stderr[-4000:]
    for impl in ("nano", "official"):
        run = compare_dir / "cells" / f"w2-s3-{impl}"
        summary = json.loads((run / "summary.json").read_text())
        assert (summary["status"], summary["rank_exit_code"], summary["steps"]) == ("failed", 1, 1), summary
        assert "Detected mismatch between collectives on ranks" in (run / "logs" / "rank0.stderr.log").read_text()


@pytest.mark.slow
@pytest.mark.official
def test_the_doctor_names_the_line_each_rank_issued_its_call_from(checked):
    compare_dir, _ = checked
    done = subprocess.run([ZERO_LAB, "doctor", str(compare_dir), "--format", "json"], capture_output=True, text=True,
                          timeout=300, cwd=REPO)
    findings = {Path(finding["runs"][0]).name: finding for finding in json.loads(done.stdout)["findings"]}
    head, vision = script_line("logits = self.head(hidden)"), script_line("hidden + self.vision(hidden)")
    frames = {"0": f"issued at skipping_script.py:{head} in forward", "1": f"issued at skipping_script.py:{vision} in forward"}
    for name in ("w2-s3-nano", "w2-s3-official"):
        # every rank raises, but torchrun stops the others once one has exited: a rank may go before it prints
        evidence = [line for line in findings[name]["evidence"] if "torch's check" in line]
        assert evidence, findings[name]["evidence"]
        for line in evidence:
            rank = line.removeprefix("rank ").split(" ")[0]
            assert line.startswith(f"rank {rank} (torch's check, --check-collectives): collective ")
            assert line.endswith(frames[rank]), line
    doc = (REPO / "docs" / "doctor.md").read_text()  # docs/doctor.md shows nano's two lines as the doctor prints them
    nano = [line for line in findings["w2-s3-nano"]["evidence"] if "torch's check" in line]
    assert all(f"    {line}\n" in doc for line in nano), nano
    assert f"Line {head} runs `head`, line {vision} `vision`" in doc
