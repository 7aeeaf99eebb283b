"""Which DeepSpeed config keys nano reads, and which it knows of but does not implement.

An unknown key is a typo or a feature nano lacks; the two get different one-line errors so the
user learns which it is.
"""

# Top-level keys official DeepSpeed accepts that nano does not implement (yet).
DEEPSPEED_ONLY_TOP_LEVEL = frozenset({
    "activation_checkpointing", "aio", "amp", "autotuning", "checkpoint", "comms_logger",
    "compile", "compression_training", "csv_monitor", "curriculum_learning", "data_efficiency",
    "dataloader_drop_last", "disable_allgather", "dump_state", "eigenvalue",
    "elasticity", "flops_profiler", "fp8", "gradient_predivide_factor", "graph_harvesting",
    "hybrid_engine", "load_universal_checkpoint", "memory_breakdown", "monitor_config",
    "nebula", "pipeline", "prescale_gradients", "progressive_layer_drop", "quantize_training",
    "seq_parallel_communication_data_type", "sequence_parallel_size", "sparse_attention",
    "sparse_gradients", "tensorboard", "tensor_parallel", "timers", "torch_autocast",
    "use_data_before_expert_parallelism", "use_node_local_storage", "wandb", "weight_quantization",
})

# zero_optimization keys official DeepSpeed accepts that nano does not implement (yet).
DEEPSPEED_ONLY_ZERO = frozenset({
    "cpu_offload_use_pin_memory", "elastic_checkpoint",
    "ignore_unused_parameters_in_stage3", "load_from_fp32_weights", "memory_efficient_linear",
    "mics_hierarchical_params_gather", "mics_shard_size",
    "override_module_apply", "pipeline_loading_checkpoint", "reduce_scatter_dtype",
    "round_robin_gradients", "use_all_reduce_for_fetch_params", "use_multi_rank_bucket_allreduce",
    "zero_quantized_nontrainable_weights",
    "zeropp_loco_param", "log_trace_cache_warnings",
    "module_granularity_threshold", "legacy_stage1",
})

# Legacy zero_optimization switches and the sections official DeepSpeed maps them to (true: the
# section with device "cpu"; false: nothing); a config may not give both.
LEGACY_OFFLOAD_KEYS = {"cpu_offload": "offload_optimizer", "cpu_offload_param": "offload_param"}

# Optimizer types official DeepSpeed accepts that nano does not implement.
DEEPSPEED_ONLY_OPTIMIZERS = frozenset({
    "Adagrad", "Lamb", "OneBitAdam", "OneBitLamb", "ZeroOneAdam", "MuAdam", "MuAdamW", "MuSGD",
    "Lion", "AdaMuon",
})

# Scheduler types official DeepSpeed accepts that nano does not implement.
DEEPSPEED_ONLY_SCHEDULERS = frozenset({"LRRangeTest", "OneCycle", "WarmupCosineDecayLR"})

# fp16 / bf16 keys official DeepSpeed accepts that nano does not implement.
DEEPSPEED_ONLY_FP16 = frozenset({"auto_cast", "fp16_master_weights_and_grads", "initial_scale"})
DEEPSPEED_ONLY_BF16 = frozenset({"bf16_master_weights_and_grads", "bf16_optimizer_states"})
DEEPSPEED_ONLY_DATA_TYPES = frozenset({"param_dtype", "buffer_dtype", "keep_in_fp32_modules"})

# The harness's and the CLI's --offload: the zero_optimization sections each choice turns on
# (parameter offload comes with the optimizer's, as ZeRO-Infinity runs it).
OFFLOAD_SECTIONS = {"none": (), "optimizer": ("offload_optimizer",), "param": ("offload_optimizer", "offload_param")}
