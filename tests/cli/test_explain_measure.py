"""`zero-lab explain --measure`: nano's recorded step on the tiny preset (2 processes, CPU) agrees
with the prediction, collective for collective and byte for byte, and the command says so."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # spawns gloo ranks: `make test-fast` leaves it out

ZERO_LAB = str(Path(sys.executable).with_name("zero-lab"))


@pytest.mark.parametrize("stage, dtype", [(2, "bfloat16"), (3, "float32")])
def test_the_measured_step_is_the_predicted_one(stage, dtype):
    done = subprocess.run([ZERO_LAB, "explain", "--model", "tiny", "--stage", str(stage), "--gpus", "2",
                           "--dtype", dtype, "--measure", "--format", "json"],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    measurement = json.loads(done.stdout)["measurement"]
    assert measurement["agrees"] is True and measurement["disagreements"] == []
    recorded = measurement["recorded"]
    assert recorded["collectives"]["backward"], "stages 2 and 3 reduce during backward"
    assert set(recorded["memory"]) == {"end_of_forward", "end_of_backward", "optimizer_step", "between_steps"}
    if stage == 3:
        assert any(item["op"].startswith("all_gather") for item in recorded["collectives"]["forward"])
