"""Train a tiny Llama with accelerate's DeepSpeed plugin and a plain training loop: the other way
people drive DeepSpeed ZeRO, here as a script `zero-lab compare --script` runs with nano and with
official DeepSpeed.

    # both impls, stages 2 and 3, 2 processes on CPU; report, verdict and compare.json
    zero-lab compare --script examples/accelerate_loop.py --gpus 2 --device cpu --stages 2,3
    # one impl, by hand
    zero-lab exec --impl nano --device cpu -- torchrun --nproc-per-node 2 examples/accelerate_loop.py \
        --deepspeed_config zero_lab/harness/configs/zero2.json

The script follows DeepSpeed's contract: `--deepspeed_config PATH` goes to
`DeepSpeedPlugin(hf_ds_config=PATH)` and the script otherwise runs as written. When the config has
an `optimizer` (or `scheduler`) section DeepSpeed builds it, and accelerate asks for its
placeholders, `DummyOptim` and `DummyScheduler`; without one the loop brings torch's AdamW.

Phase 1: the model, a 2-layer Llama from a config, its weights drawn from --seed before the engine
         exists, so every impl starts from the same weights.
Phase 2: the data: random token ids from --seed, in order (no shuffling), each rank its own shard
         (accelerate's prepared data loader), so every impl sees the same batches.
Phase 3: accelerate prepares model, optimizer, data and scheduler; the loop runs --max-steps
         optimizer steps, `accelerator.accumulate` marking the accumulation boundaries.
"""

from __future__ import annotations

import argparse
import json

import torch
from accelerate import Accelerator, DeepSpeedPlugin
from accelerate.utils import DummyOptim, DummyScheduler, set_seed

from tiny_llama import random_tokens, tiny_llama  # beside this script

def optimizer_and_scheduler(config: dict, model: torch.nn.Module):
    """DeepSpeed's own (placeholders) when the config names them, else torch's AdamW and a constant LR."""
    if "optimizer" in config:
        optimizer = DummyOptim(model.parameters())
    else:
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.0)
    if "scheduler" in config:
        scheduler = DummyScheduler(optimizer)
    else:
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    return optimizer, scheduler


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--deepspeed_config", required=True, help="DeepSpeed JSON config")
    parser.add_argument("--max-steps", type=int, default=6, help="optimizer steps")
    parser.add_argument("--seq-len", type=int, default=64, help="tokens per sample")
    parser.add_argument("--seed", type=int, default=42, help="seed of the weights and the data")
    args = parser.parse_args()

    with open(args.deepspeed_config) as handle:
        config = json.load(handle)
    micro_batch = config["train_micro_batch_size_per_gpu"]
    accumulation = config.get("gradient_accumulation_steps", 1)
    accelerator = Accelerator(deepspeed_plugin=DeepSpeedPlugin(hf_ds_config=args.deepspeed_config),
                              gradient_accumulation_steps=accumulation)
    # Phase 1
    set_seed(args.seed)
    model = tiny_llama()
    # Phase 2
    samples = args.max_steps * micro_batch * accumulation * accelerator.num_processes
    tokens = random_tokens(samples, args.seq_len, args.seed)
    loader = torch.utils.data.DataLoader(tokens, batch_size=micro_batch, shuffle=False)
    # Phase 3
    optimizer, scheduler = optimizer_and_scheduler(config, model)
    model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)
    model.train()
    for batch in loader:
        with accelerator.accumulate(model):
            loss = model(input_ids=batch, labels=batch).loss
            accelerator.backward(loss)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
    accelerator.end_training()


if __name__ == "__main__":
    main()
