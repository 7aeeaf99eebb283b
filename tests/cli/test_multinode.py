"""Two torchrun nodes on one host (`zero-lab run --nnodes 2 --node-rank 0|1 --rdzv-endpoint ...`):
both say the real world size, the node that ran global rank 0 has the steps (with the losses of a
one-node run of the same ranks), and the other node says where they are.

Three real runs of tiny, 2 steps (two nodes of one process, then one node of two): about 40 s.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.ports import free_port

pytestmark = pytest.mark.slow
ZERO_LAB = str(Path(sys.executable).with_name("zero-lab"))
WORKLOAD = ["--impl", "nano", "--device", "cpu", "--model", "tiny", "--steps", "2", "--format", "json"]


def summary_of(out: Path) -> dict:
    (run_dir,) = [path for path in out.iterdir() if path.is_dir()]
    return json.loads((run_dir / "summary.json").read_text())


def test_two_nodes_on_one_host_show_the_real_world_size_and_where_the_steps_are(tmp_path):
    endpoint = f"127.0.0.1:{free_port()}"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    nodes = [subprocess.Popen([ZERO_LAB, "run", *WORKLOAD, "--gpus", "1", "--nnodes", "2", "--node-rank", str(node),
                               "--rdzv-endpoint", endpoint, "--rdzv-id", "two-nodes", "--out", str(tmp_path / f"node{node}")],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
             for node in (0, 1)]
    outputs = [node.communicate(timeout=300) for node in nodes]
    assert [node.returncode for node in nodes] == [0, 0], outputs
    summaries = [summary_of(tmp_path / f"node{node}") for node in (0, 1)]
    assert [summary["world_size"] for summary in summaries] == [2, 2]
    with_steps = [summary for summary in summaries if summary["steps"]]
    without = [summary for summary in summaries if not summary["steps"]]
    assert len(with_steps) == len(without) == 1  # rendezvous decides which node runs global rank 0
    assert "global rank 0 ran on another node" in (without[0]["note"] or "")
    assert with_steps[0]["note"] is None
    stderr_of_other = outputs[summaries.index(without[0])][1]
    assert "note: global rank 0 ran on another node" in stderr_of_other
    assert all("nano w2 s2" in stderr for _, stderr in outputs)  # the progress line's world size

    single = subprocess.run([ZERO_LAB, "run", *WORKLOAD, "--gpus", "2", "--out", str(tmp_path / "single")],
                            capture_output=True, text=True, env=env, timeout=300)
    assert single.returncode == 0, single.stderr
    assert with_steps[0]["losses"] == summary_of(tmp_path / "single")["losses"]
