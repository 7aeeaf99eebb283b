"""The DeepSpeed config mapped onto FSDP2 (zero_lab.fsdp2.config_map) and `zero-lab config fsdp2`:
pure, nothing launched."""

import json

import pytest
from typer.testing import CliRunner

from zero_lab.cli.app import app

from zero_lab.fsdp2.config_map import Fsdp2ConfigError, map_config, not_applicable_message


def config(stage=3, **extra):
    return {"train_micro_batch_size_per_gpu": 2, "optimizer": {"type": "AdamW", "params": {"lr": 0.01}},
            "zero_optimization": {"stage": stage}, **extra}


@pytest.mark.parametrize("stage, reshard", [(2, False), (3, True)])
def test_stage_decides_reshard_after_forward(stage, reshard):
    plan = map_config(config(stage))
    assert (plan.stage, plan.reshard_after_forward) == (stage, reshard)
    assert plan.param_dtype is None and plan.reduce_dtype is None and not plan.cpu_offload


@pytest.mark.parametrize("stage", [0, 1])
def test_stages_without_an_fsdp2_equivalent_are_refused_in_one_line(stage):
    with pytest.raises(Fsdp2ConfigError, match=f"stage {stage} has no FSDP2 equivalent.*; use stage 2 .* or 3 .* for fsdp2"):
        map_config(config(stage))


def test_fp16_and_a_gradient_sum_are_refused():
    with pytest.raises(Fsdp2ConfigError, match="fp16 has no FSDP2 equivalent"):
        map_config(config(fp16={"enabled": True}))
    with pytest.raises(Fsdp2ConfigError, match="sum"):
        map_config(config(gradient_allreduce_op="sum"))


def test_bf16_becomes_a_mixed_precision_policy_and_communication_dtype_its_reduce_dtype():
    assert (map_config(config(bf16={"enabled": True})).param_dtype,
            map_config(config(bf16={"enabled": True})).reduce_dtype) == ("bfloat16", "bfloat16")
    plan = map_config(config(bf16={"enabled": True}, communication_data_type="fp32"))
    assert (plan.param_dtype, plan.reduce_dtype) == ("bfloat16", "float32")


def test_offload_accumulation_clipping_optimizer_and_schedule_are_mapped():
    plan = map_config(config(3, gradient_accumulation_steps=3, gradient_clipping=0.5,
                             optimizer={"type": "Adam", "params": {"lr": 0.1, "betas": [0.8, 0.9], "eps": 1e-6,
                                                                   "weight_decay": 0.2, "adam_w_mode": True}},
                             scheduler={"type": "WarmupLR", "params": {"warmup_num_steps": 4}},
                             zero_optimization={"stage": 3, "offload_optimizer": {"device": "cpu", "pin_memory": False}}),
                      world_size=2)
    assert plan.cpu_offload and not plan.pin_memory
    assert (plan.gradient_accumulation_steps, plan.gradient_clipping) == (3, 0.5)
    assert plan.optimizer == "AdamW"
    assert plan.optimizer_params == {"lr": 0.1, "betas": (0.8, 0.9), "eps": 1e-6, "weight_decay": 0.2, "fused": True}
    assert plan.scheduler == ("WarmupLR", {"warmup_num_steps": 4})
    assert map_config(config(optimizer={"type": "Adam", "params": {"adam_w_mode": False}})).optimizer == "Adam"


def test_every_key_the_file_sets_is_one_row_and_the_inapplicable_ones_one_warning():
    plan = map_config(config(2, zero_optimization={"stage": 2, "reduce_bucket_size": 100, "overlap_comm": True}))
    rows = {row.key: row for row in plan.rows}
    assert set(rows) == {"train_micro_batch_size_per_gpu", "optimizer.type", "optimizer.params.lr",
                         "zero_optimization.stage", "zero_optimization.reduce_bucket_size",
                         "zero_optimization.overlap_comm"}
    assert rows["zero_optimization.stage"].fsdp2 == "fully_shard(reshard_after_forward=False)"
    assert [row.key for row in plan.not_applicable] == ["zero_optimization.reduce_bucket_size",
                                                        "zero_optimization.overlap_comm"]
    assert not_applicable_message(plan).startswith(
        "config keys zero_optimization.reduce_bucket_size, zero_optimization.overlap_comm are not applicable")
    assert not_applicable_message(map_config(config())) is None


def test_config_fsdp2_prints_the_mapping_and_refuses_stage_1(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config(3, zero_optimization={"stage": 3, "stage3_prefetch_bucket_size": 10})))
    done = CliRunner().invoke(app, ["config", "fsdp2", str(path)])
    assert done.exit_code == 0, done.output
    assert "fully_shard(reshard_after_forward=True)" in done.stdout
    assert "stage3_prefetch_bucket_size  10  ->  not applicable: FSDP2 prefetches" in done.stdout
    path.write_text(json.dumps(config(1)))
    done = CliRunner().invoke(app, ["config", "fsdp2", str(path)])
    assert done.exit_code == 2 and done.stdout == ""
    assert done.stderr.startswith("error: ") and len(done.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("argv, names", [
    (["compare", "--impls", "nano,fsdp2", "--script", "examples/hf_trainer.py", "--out", "{tmp}", "--name", "c"],
     "--script"),
    (["compare", "--impls", "nano,official,fsdp2", "--stages", "1,2", "--out", "{tmp}", "--name", "c"], "stage 1"),
], ids=["script", "stage-1"])
def test_what_fsdp2_cannot_run_is_refused_in_one_line_before_any_launch(tmp_path, argv, names):
    """docs/fsdp2.md's "Which one should I pick" lists these: exit 2, one `error:` line, nothing made."""
    done = CliRunner().invoke(app, [part.format(tmp=tmp_path) for part in argv] + ["--gpus", "2", "--device", "cpu"])
    assert done.exit_code == 2, done.output
    assert done.stderr.startswith("error: ") and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert names in done.stderr and "fsdp2" in done.stderr.lower() and done.stdout == ""
    assert list(tmp_path.iterdir()) == []


def test_estimate_adds_fsdp2_rows_from_its_formula_for_stages_2_and_3():
    from zero_lab.analysis.memory.estimate import MIB
    from zero_lab.fsdp2.memory_formula import moment_bytes
    from zero_lab.workload.model_shapes import preset_parameters

    done = CliRunner().invoke(app, ["estimate", "--model", "tiny", "--gpus", "2,3", "--stages", "1,2,3",
                                    "--impls", "nano,official,fsdp2", "--format", "json"])
    assert done.exit_code == 0, done.output
    shapes = [entry.shape for entry in preset_parameters("tiny")]
    for row in json.loads(done.stdout)["rows"]:
        expected = moment_bytes(shapes, row["world_size"], "backward") / MIB if row["stage"] > 1 else None
        assert row["fsdp2_mb"] == expected, row
    refused = CliRunner().invoke(app, ["estimate", "--model", "tiny", "--impls", "nano,fsdp3"])
    assert refused.exit_code == 2 and "unknown impl 'fsdp3'" in refused.stderr
