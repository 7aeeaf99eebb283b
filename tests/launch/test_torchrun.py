"""torchrun command building: pure, nothing launched."""

from pathlib import Path

from zero_lab.launch.torchrun import (
    TRAIN_SCRIPT, LaunchSpec, MultiNode, Workload, launch_environment, agent_store_environment, threads_per_process,
    torchrun_command, watched_stall_timeout_s,
)


def spec(**overrides):
    base = dict(impl="official", stage=2, nproc=2, device="cpu", config_path=Path("/r/config.json"),
                workload=Workload(model="tiny", steps=5, seq_len=64), log_dir=Path("/r/torchrun-logs"),
                python="python")
    return LaunchSpec(**{**base, **overrides})


def flag(command, name):
    return command[command.index(name) + 1]


def test_single_node_command_binds_port_0_and_has_every_harness_flag():
    command = torchrun_command(spec())
    assert command[:3] == ["python", "-m", "torch.distributed.run"]
    assert flag(command, "--nproc-per-node") == "2"
    assert flag(command, "--rdzv-backend") == "c10d" and flag(command, "--rdzv-endpoint") == "127.0.0.1:0"
    assert "--master-port" not in command
    script = command.index(str(TRAIN_SCRIPT))
    launcher, harness = command[:script], command[script + 1:]
    assert flag(launcher, "--redirects") == "3" and flag(launcher, "--log-dir") == "/r/torchrun-logs"
    assert flag(harness, "--impl") == "official" and flag(harness, "--zero-stage") == "2"
    assert flag(harness, "--deepspeed_config") == "/r/config.json"
    assert flag(harness, "--steps") == "5" and flag(harness, "--seq-len") == "64"
    assert flag(harness, "--model-name") == "tiny" and flag(harness, "--model-dtype") == "float32"
    assert "--batch-size" not in harness and "--dataset-path" not in harness, "unset flags keep harness defaults"


def test_the_harness_gives_up_on_a_collective_a_minute_after_the_cli_would_call_the_run_stalled():
    harness = torchrun_command(spec(stall_timeout_s=5.0))
    assert flag(harness, "--dist-timeout") == "65"
    assert "--dist-timeout" not in torchrun_command(spec(stall_timeout_s=0.0)), "no watch: the harness's default"


def test_on_several_nodes_only_the_process_group_timeout_watches():
    """Only the node that holds global rank 0 sees [opt_step] lines, and rendezvous decides which."""
    node = MultiNode(nnodes="2", node_rank=0, rdzv_endpoint="head:29400")
    assert watched_stall_timeout_s(spec(stall_timeout_s=30.0)) == 30.0
    assert watched_stall_timeout_s(spec(stall_timeout_s=30.0, multi_node=node)) == 0.0
    assert flag(torchrun_command(spec(stall_timeout_s=30.0, multi_node=node)), "--dist-timeout") == "90"


def test_multi_node_flags_pass_through_and_replace_the_static_port():
    node = MultiNode(nnodes="2", node_rank=1, rdzv_endpoint="head:29400", rdzv_id="job7")
    command = torchrun_command(spec(multi_node=node, extra_torchrun_args=["--max-restarts", "0"]))
    assert flag(command, "--nnodes") == "2" and flag(command, "--rdzv-backend") == "c10d"
    assert "--node-rank=1" in command and "--rdzv-endpoint=head:29400" in command and "--rdzv-id=job7" in command
    assert "--master-port" not in command
    assert command.index("--max-restarts") < command.index(str(TRAIN_SCRIPT))


def test_cpu_environment_splits_cores_and_selects_deepspeeds_cpu_accelerator():
    env = launch_environment({"PATH": "/bin"}, "cpu", nproc=2, cores=16)
    assert env["OMP_NUM_THREADS"] == "8" and env["DS_ACCELERATOR"] == "cpu" and env["LOCAL_SIZE"] == "2"
    assert threads_per_process(2, 4) == 1
    assert "OMP_NUM_THREADS" not in launch_environment({}, "cuda", nproc=2, cores=16)


def test_ds_accelerator_is_set_per_device_over_a_leftover():
    """Issue 17, finding 9: a DS_ACCELERATOR=cpu left in the CLI's environment reaches every rank
    of a CUDA run through torchrun; the launch names the run's own device instead."""
    assert launch_environment({"DS_ACCELERATOR": "cpu"}, "cuda", nproc=2, cores=16)["DS_ACCELERATOR"] == "cuda"
    assert launch_environment({"DS_ACCELERATOR": "cuda"}, "cpu", nproc=2, cores=16)["DS_ACCELERATOR"] == "cpu"
    assert launch_environment({}, "cuda", nproc=1, cores=16)["DS_ACCELERATOR"] == "cuda"


def test_multi_node_launches_keep_their_own_store():
    multi = spec(multi_node=MultiNode(nnodes="2", rdzv_endpoint="h:1"))
    assert "--master-port" not in torchrun_command(multi) and agent_store_environment(multi) == {}
    assert agent_store_environment(spec()) == {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "0"}
