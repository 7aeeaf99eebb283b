"""`--max-restarts` without a launch: the torchrun command it builds, where each cell's checkpoints go, and the
bad input it refuses (one line, exit 2). What a launched restart does: tests/cli/test_restarts.py."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from zero_lab.cli.app import app
from zero_lab.cli.jobs import with_elastic_global_batch, with_restarts
from zero_lab.launch import torchrun

runner = CliRunner()


def spec(max_restarts: int, **multi_node) -> torchrun.LaunchSpec:
    return torchrun.LaunchSpec(impl="nano", stage=2, nproc=2, device="cpu", config_path=Path("c.json"),
                               workload=torchrun.Workload(save_every=2), log_dir=Path("logs"), port=29500,
                               multi_node=torchrun.MultiNode(**multi_node), max_restarts=max_restarts)


def following(command: list[str], flag: str) -> str | None:
    return command[command.index(flag) + 1] if flag in command else None


def test_a_restartable_launch_uses_c10d_rendezvous_and_the_agents_store():
    command = torchrun.torchrun_command(spec(3))
    assert (following(command, "--rdzv-backend"), following(command, "--rdzv-endpoint")) == ("c10d", "127.0.0.1:29500")
    assert following(command, "--max-restarts") == "3" and "--master-port" not in command
    assert torchrun.agent_store_environment(spec(3)) == {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "0"}


def test_without_restarts_the_launch_has_the_same_rendezvous_and_no_restarts():
    command = torchrun.torchrun_command(spec(0))
    assert (following(command, "--rdzv-backend"), following(command, "--rdzv-endpoint")) == ("c10d", "127.0.0.1:29500")
    assert "--max-restarts" not in command and "--master-port" not in command


def test_an_elastic_range_keeps_its_rendezvous_and_gains_the_restarts():
    command = torchrun.torchrun_command(spec(1, nnodes="1:2", rdzv_endpoint="127.0.0.1:29400"))
    assert following(command, "--nnodes") == "1:2" and following(command, "--max-restarts") == "1"
    assert "--rdzv-endpoint=127.0.0.1:29400" in command


def test_a_cell_that_saves_for_its_restarts_keeps_its_checkpoints_in_its_directory(tmp_path):
    restarted = with_restarts(spec(2), 2, tmp_path / "cell")
    assert restarted.workload.save_dir == str((tmp_path / "cell" / "checkpoints").resolve())
    assert restarted.max_restarts == 2
    given = with_restarts(dataclasses.replace(spec(2), workload=torchrun.Workload(save_every=2, save_dir="/elsewhere")),
                          2, tmp_path)
    assert given.workload.save_dir == "/elsewhere"
    assert with_restarts(spec(0), 0, tmp_path).workload.save_dir is None


def test_restarts_with_no_checkpoint_to_resume_are_said_at_launch():
    """A restarted group resumes from a checkpoint saved during the run; without one it trains again from
    where the run started, which the launch says (a user's script saves its own: nothing said)."""
    from zero_lab.cli.jobs import SharedSettings, restart_from_the_start_note

    def shared(max_restarts, save_every=0, script=None):
        return SharedSettings(None, "cpu", torchrun.Workload(save_every=save_every), torchrun.MultiNode(), [],
                              script=script, max_restarts=max_restarts)

    note = restart_from_the_start_note(shared(1), "add --save-every K")
    assert note.startswith("note: --max-restarts 1 with no checkpoint saved during the run") and "--save-every K" in note
    assert restart_from_the_start_note(shared(1, save_every=2), "x") is None
    assert restart_from_the_start_note(shared(0), "x") is None
    assert restart_from_the_start_note(shared(1, script=object()), "x") is None


@pytest.mark.parametrize("arguments, words", [
    (["run", "--max-restarts", "-1"], "--max-restarts -1 is negative"),
    (["compare", "--max-restarts", "1", "--", "--max-restarts", "2"], "--max-restarts is given twice"),
    (["compare", "--save-every", "2"], "--save-every on compare keeps checkpoints for restarts only"),
])
def test_bad_restart_input_is_one_line_and_exit_2(arguments, words, monkeypatch):
    from zero_lab.launch import torchrun_job

    monkeypatch.setattr(torchrun_job.subprocess, "Popen", lambda *a, **k: pytest.fail("bad input launched torchrun"))
    result = runner.invoke(app, [*arguments[:1], "--device", "cpu", *arguments[1:]])
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and words in lines[0], result.stderr


def test_a_save_dir_holding_an_earlier_runs_checkpoint_is_refused_unless_resumed(tmp_path, monkeypatch):
    from zero_lab.launch import torchrun_job

    monkeypatch.setattr(torchrun_job.subprocess, "Popen", lambda *a, **k: pytest.fail("bad input launched torchrun"))
    (tmp_path / "latest").write_text("global_step4")
    result = runner.invoke(app, ["run", "--device", "cpu", "--model", "tiny", "--max-restarts", "1", "--save-dir",
                                 str(tmp_path), "--out", str(tmp_path / "runs")])
    assert result.exit_code == 2 and "already holds a checkpoint (`latest`)" in result.stderr, result.output


def elastic(nnodes: str, impl: str = "nano", nproc: int = 2, max_restarts: int = 1) -> torchrun.LaunchSpec:
    return dataclasses.replace(spec(max_restarts, nnodes=nnodes, rdzv_endpoint="node0:29400"), impl=impl, nproc=nproc)


def test_an_elastic_range_with_restarts_keeps_the_global_batch_of_its_largest_world():
    staged = {"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1}
    kept = with_elastic_global_batch(elastic("1:2"), staged, Path("zero2.json"))
    assert kept.workload.global_batch_size == 16  # 2 machines x 2 ranks x 4 samples (docs/restarts.md)
    assert "--global-batch-size" in torchrun.train_arguments(kept)
    for unchanged in (elastic("2"), elastic("2:2"), elastic("1:2", max_restarts=0)):
        assert with_elastic_global_batch(unchanged, staged, Path("c.json")).workload.global_batch_size is None


def test_the_harness_infers_the_accumulation_of_each_world_size_from_the_global_batch():
    from zero_lab.nano.config import load_config
    from zero_lab.workload.run_config import keep_global_batch

    config = {"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1}
    keep_global_batch(config, 16)
    assert config == {"train_micro_batch_size_per_gpu": 4, "train_batch_size": 16}
    assert [load_config(dict(config), world_size=size).gradient_accumulation_steps for size in (4, 2, 1)] == [1, 2, 4]


@pytest.mark.parametrize("nnodes, impl, nproc, words", [
    ("1:3", "nano", 2, "does not split into whole micro-batches on 2 node(s)"),
    ("1:2", "official", 2, "--impl official cannot resume a checkpoint at another world size"),
    ("2:1", "nano", 2, "--nnodes 2:1 is not an elastic range MIN:MAX"),
])
def test_an_elastic_range_that_cannot_keep_its_batch_is_refused(nnodes, impl, nproc, words):
    from zero_lab.cli.errors import BadInput

    with pytest.raises(BadInput, match=re.escape(words)):
        with_elastic_global_batch(elastic(nnodes, impl, nproc), {"train_micro_batch_size_per_gpu": 4}, Path("c.json"))
