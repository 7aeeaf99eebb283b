"""Train a tiny Llama with Hugging Face's Trainer under DeepSpeed ZeRO: the way most people drive
DeepSpeed, here as a script `zero-lab compare --script` runs with nano and with official DeepSpeed.

    # both impls, stages 2 and 3, 2 processes on CPU; report, verdict and compare.json
    zero-lab compare --script examples/hf_trainer.py --gpus 2 --device cpu --stages 2,3
    # one impl, by hand (the config: any DeepSpeed JSON, e.g. zero_lab/harness/configs/zero2.json)
    zero-lab exec --impl nano --device cpu -- torchrun --nproc-per-node 2 examples/hf_trainer.py \
        --deepspeed_config zero_lab/harness/configs/zero2.json

The script follows DeepSpeed's contract: `--deepspeed_config PATH` goes to
`TrainingArguments(deepspeed=PATH)` and the script otherwise runs as written. The Trainer refuses
a config whose batch size, accumulation, learning rate, Adam settings, clipping, warm-up or bf16
disagree with its own arguments, so they are read from the config.

Phase 1: the config's training settings, and the model: a 2-layer Llama from a config, its weights
         drawn from --seed before anything else (built before TrainingArguments, so the weights do
         not depend on how an engine initialises them under `zero.Init`).
Phase 2: the data: random token ids from --seed, as many samples as --max-steps optimizer steps
         take; the Trainer's sampler is seeded too, so every impl sees the same batches in the same
         order.
Phase 3: Trainer.train() for --max-steps optimizer steps, no evaluation, and a checkpoint every
         --save-steps steps (none by default); then the process group is destroyed (the Trainer
         leaves it alive).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile

import torch
from transformers import Trainer, TrainingArguments, set_seed

from tiny_llama import random_tokens, tiny_llama  # beside this script

class RandomTokens(torch.utils.data.Dataset):
    """Fixed random token ids; each sample is its own label (the model shifts them)."""

    def __init__(self, samples: int, seq_len: int, seed: int):
        self.tokens = random_tokens(samples, seq_len, seed)

    def __len__(self) -> int:
        return len(self.tokens)

    def __getitem__(self, index: int) -> dict:
        return {"input_ids": self.tokens[index], "labels": self.tokens[index]}


def training_arguments(config: dict, args: argparse.Namespace, output_dir: str) -> TrainingArguments:
    """The Trainer's arguments, each equal to the config's value where the Trainer checks one."""
    optimizer = config.get("optimizer", {}).get("params", {})
    scheduler = config.get("scheduler", {}).get("params", {})
    betas = optimizer.get("betas", [0.9, 0.999])
    bf16 = config.get("bf16", {}).get("enabled", False)
    return TrainingArguments(
        output_dir=output_dir, deepspeed=args.deepspeed_config, max_steps=args.max_steps, seed=args.seed,
        per_device_train_batch_size=config["train_micro_batch_size_per_gpu"],
        gradient_accumulation_steps=config.get("gradient_accumulation_steps", 1),
        learning_rate=optimizer.get("lr", 1e-3), adam_beta1=betas[0], adam_beta2=betas[1],
        adam_epsilon=optimizer.get("eps", 1e-8), weight_decay=optimizer.get("weight_decay", 0.0),
        max_grad_norm=config.get("gradient_clipping", 1.0), warmup_steps=scheduler.get("warmup_num_steps", 0),
        bf16=bf16, logging_steps=1, save_strategy="steps" if args.save_steps else "no", save_steps=args.save_steps or 500,
        report_to=[], disable_tqdm=True, dataloader_num_workers=0,
        # without a GPU the Trainer refuses bf16 unless it is told it runs on the CPU on purpose
        use_cpu=bf16 and not torch.cuda.is_available())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--deepspeed_config", required=True, help="DeepSpeed JSON config")
    parser.add_argument("--max-steps", type=int, default=6, help="optimizer steps")
    parser.add_argument("--seq-len", type=int, default=64, help="tokens per sample")
    parser.add_argument("--seed", type=int, default=42, help="seed of the weights, the data and the sampler")
    parser.add_argument("--output-dir", default=None, help="the Trainer's output directory (default: a temporary one)")
    parser.add_argument("--save-steps", type=int, default=0,
                        help="save a checkpoint every N optimizer steps (save_strategy 'steps'; default 0: none)")
    args = parser.parse_args()

    # Phase 1
    with open(args.deepspeed_config) as handle:
        config = json.load(handle)
    set_seed(args.seed)
    model = tiny_llama()
    # Phase 2
    world_size = int(os.environ.get("WORLD_SIZE", 1))
    samples = args.max_steps * config["train_micro_batch_size_per_gpu"] \
        * config.get("gradient_accumulation_steps", 1) * world_size
    dataset = RandomTokens(samples, args.seq_len, args.seed)
    # Phase 3: without --output-dir, a scratch directory every rank of this launch names alike (a
    # checkpoint's files from all ranks go into one directory)
    scratch = os.path.join(tempfile.gettempdir(), f"hf_trainer-{os.environ.get('TORCHELASTIC_RUN_ID', os.getpid())}")
    trainer = Trainer(model=model, args=training_arguments(config, args, args.output_dir or scratch),
                      train_dataset=dataset)
    trainer.train()
    # The Trainer leaves the process group alive; a gloo group alive at exit can abort the
    # interpreter's teardown (SIGABRT), so end as PyTorch asks every script to.
    if torch.distributed.is_initialized():
        torch.distributed.barrier()  # every rank is done with the scratch directory
        torch.distributed.destroy_process_group()
    if args.output_dir is None and int(os.environ.get("RANK", 0)) == 0:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
