"""nano: a readable ZeRO stage 0/1/2 engine, a drop-in for `deepspeed.initialize`.

    import zero_lab.nano as deepspeed
    engine, optimizer, _, scheduler = deepspeed.initialize(model=model, model_parameters=params,
                                                           config="ds_config.json")

Vocabulary: every tensor a reader meets (P = parameters of a group, padded to a multiple of the
world size N; bytes per rank; "w" = 4 in fp32, 2 in bf16/fp16)

| name                     | what it is                                                  | stage 0 | stage 1   | stage 2   |
|--------------------------|-------------------------------------------------------------|---------|-----------|-----------|
| flat parameter buffer    | all parameters end to end; each param.data is a view of it  | wP      | wP        | wP        |
| partition                | this rank's 1/N slice [rank*P/N, (rank+1)*P/N) of a flat buffer | all  | P/N       | P/N       |
| fp32 master partition    | fp32 copy of the partition Adam updates (fp32: the partition itself, no copy) | 4P / 0 | 4P/N / 0 | 4P/N / 0 |
| full gradient buffer     | flat gradients; each param.grad is a view of it             | wP      | wP        | -         |
| gradient bucket          | a flat range of gradients reduced together (reduce_bucket_size) | view | view      | transient |
| gradient partition       | fp32 averaged gradients of the partition (fp32 stages 0/1: the buffer's slice) | 4P / 0 | 4P/N / 0 | 4P/N |
| optimizer-state partition| Adam's exp_avg and exp_avg_sq for the partition, fp32       | 8P      | 8P/N      | 8P/N      |

Totals per parameter (see `memory_formula` and docs/nano-memory.md): fp32 16 / 8+8/N / 4+12/N;
bf16 20 / 4+16/N / 2+16/N. Layers, each importing only those above it in this list:
collectives -> flat_buffer, gradient_reduction -> adamw, loss_scaler, lr_schedules -> zero_optimizer
-> stage0 -> stage1 -> stage2 -> engine -> initialize (this package's API).
"""

from zero_lab.nano.distributed import init_distributed
from zero_lab.nano.engine import NanoEngine
from zero_lab.nano.errors import NanoConfigError
from zero_lab.nano.initialize import add_config_arguments, initialize

__all__ = ["initialize", "init_distributed", "add_config_arguments", "NanoEngine", "NanoConfigError"]
