"""Parsing zero-lab's log contract, the seed's CUDA-named logs, and garbled lines."""

import math

from zero_lab.analysis.runs.logparse import parse_text
from zero_lab.workload.log_contract.log_lines import format_line

OURS = """\
W1129 torch/distributed/run.py:874] Setting OMP_NUM_THREADS
[default0]:[zero] impl=nano stage=2 world_size=2 reduce_scatter=true reduce_bucket_size=500000000 allgather_bucket_size=500000000 overlap_comm=false communication_data_type=fp32
[default0]:[model] name=tiny params=849536 param_dtype=torch.float32 compute_dtype=torch.float32 ds_precision=fp32 device=cpu
[default0]:[opt_step 1] loss=5.5612 grad_norm=1.25 lr=0.001 loss_scale=1.0 step_ms=120.5 tokens_per_s=4200.0 alloc_max_mb=20.5 reserved_max_mb=810.0 peak_alloc_max_mb=30.25 peak_reserved_max_mb=815.0 comm_mb=6.48 new_field=7
[default0]:[opt_step 2] loss=5.4011 grad_norm=1.1 lr=0.001 loss_scale=1.0 step_ms=100.0 tokens_per_s=5000.0 alloc_max_mb=21.0 reserved_max_mb=811.0 peak_alloc_max_mb=31.0 peak_reserved_max_mb=816.0 comm_mb=6.48
[default0]:[comm] op=reduce_scatter calls=4 mb=6.48
[default0]:[comm] op=all_gather calls=2 mb=6.48
[default0]:[ckpt] action=save step=2 tag=global_step2 bytes=13697136 files=3 seconds=0.066
[default0]:[warn] non-finite loss at step 3
"""

SEED = """\
[zero] stage=2 reduce_scatter=False reduce_bucket_size=500000000 communication_data_type=bf16
[model] /root/autodl-tmp/pretrained_models/Qwen3-0.6B param_dtype=torch.bfloat16 compute_dtype=torch.bfloat16 ds_precision=bf16
[opt_step 1] loss=2.3456 cuda_alloc_max_mb=7340.5 cuda_reserved_max_mb=13720.0 cuda_peak_alloc_max_mb=10260.2 cuda_peak_reserved_max_mb=13720.0
[opt_step 2] loss=2.3001 cuda_alloc_max_mb=7340.5 cuda_reserved_max_mb=13720.0 cuda_peak_alloc_max_mb=10261.0 cuda_peak_reserved_max_mb=13722.0
"""


def test_our_log_parses_every_line_of_the_contract():
    log = parse_text(OURS)
    assert log.zero == {"impl": "nano", "stage": 2, "world_size": 2, "reduce_scatter": True,
                        "reduce_bucket_size": 500000000, "allgather_bucket_size": 500000000, "overlap_comm": False,
                        "communication_data_type": "fp32"}
    assert type(log.zero["stage"]) is int and log.model["params"] == 849536 and log.model["device"] == "cpu"
    assert [row["step"] for row in log.steps] == [1, 2]
    assert log.steps[0]["peak_alloc_max_mb"] == 30.25 and log.steps[0]["comm_mb"] == 6.48
    assert log.steps[0]["new_field"] == 7, "extra fields are kept"
    assert [c["op"] for c in log.comm] == ["reduce_scatter", "all_gather"]
    assert log.warnings == ["non-finite loss at step 3"]
    assert log.checkpoints == [{"action": "save", "step": 2, "tag": "global_step2", "bytes": 13697136, "files": 3,
                                "seconds": 0.066}]
    assert log.skipped_lines == 0
    assert log.losses() == {1: 5.5612, 2: 5.4011}


def test_seed_cuda_names_map_to_our_columns():
    log = parse_text(SEED)
    assert log.steps[1]["alloc_max_mb"] == 7340.5
    assert log.steps[1]["reserved_max_mb"] == 13720.0
    assert log.steps[1]["peak_alloc_max_mb"] == 10261.0
    assert log.steps[1]["peak_reserved_max_mb"] == 13722.0
    assert not any(key.startswith("cuda_") for key in log.steps[0])
    assert log.zero == {"stage": 2, "reduce_scatter": False, "reduce_bucket_size": 500000000,
                        "communication_data_type": "bf16"}


def test_the_seeds_model_line_keeps_its_bare_model_path_as_name():
    log = parse_text(SEED)
    assert log.model == {"name": "/root/autodl-tmp/pretrained_models/Qwen3-0.6B", "param_dtype": "torch.bfloat16",
                         "compute_dtype": "torch.bfloat16", "ds_precision": "bf16"}
    assert log.skipped_lines == 0


def test_what_the_harness_writes_the_reader_reads_back_with_the_same_types():
    fields = {"impl": "nano", "stage": 3, "reduce_scatter": True, "overlap_comm": False, "offload_param": None,
              "loss": 5.53232265, "grad_norm": math.nan, "alloc_max_bytes": 6835208, "name": "a model"}
    log = parse_text("\n".join([format_line("zero", fields), format_line("opt_step", fields, step=4)]))
    expected = {**fields, "name": "a_model"}
    assert log.zero.keys() == expected.keys() and log.steps[0]["step"] == 4
    for key, value in expected.items():
        for read in (log.zero[key], log.steps[0][key]):
            assert type(read) is type(value), (key, read, value)
            assert read == value or (math.isnan(read) and math.isnan(value)), (key, read, value)


def test_garbled_and_truncated_lines_are_skipped_and_counted():
    text = "\n".join([
        "[opt_step 1] loss=5.0 alloc_max_mb=10.0",
        "[opt_step 2] loss=4.9 alloc_max_mb=",              # cut off after '='
        "[opt_step 3] loss=4.8 alloc_ma",                   # cut off inside a key
        "[opt_step 4] loss=4.7[opt_step 5] loss=4.6",       # two ranks' output fused
        "[opt_step 6] grad_norm=1.0",                       # no loss
        "[opt_step 7] loss=oops",                           # loss not a number
        "[zero]",                                           # header with nothing in it
        "[opt_step 8] loss=nan alloc_max_mb=11.0",          # a real non-finite loss is kept
        "\x00\xff binary noise [opt_step",
    ])
    log = parse_text(text)
    assert [row["step"] for row in log.steps] == [1, 8]
    assert math.isnan(log.steps[1]["loss"])
    assert log.skipped_lines == 6


def test_empty_log():
    log = parse_text("")
    assert log.steps == [] and log.skipped_lines == 0
