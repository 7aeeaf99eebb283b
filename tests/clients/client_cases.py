"""The HF Trainer and accelerate driving `import deepspeed`, unchanged for either engine (the test runs
this script under torchrun with nano's drop-in first on PYTHONPATH, or with official DeepSpeed).

    torchrun --nproc_per_node 2 client_cases.py --out DIR --cases trainer-s2,accelerate-adamw [--resume-from DIR]
        [--resumed-out DIR2]

Each case trains a tiny Llama built from a config for 3 optimizer steps on fixed random tokens and
writes DIR/<case>/rank<r>.json: the loss of every micro-step (recorded from the client's own
training step), and the learning rates. Trainer cases also save the model (`save_model()`, DIR/<case>/model)
and a checkpoint after step 2 (DIR/<case>/checkpoint-2); with --resume-from the Trainer resumes
from <that DIR>/<case>/checkpoint-2 instead and trains step 3 only. With --resumed-out as well, the
cases first train fresh into --out, then the Trainer cases resume into DIR2: one launch does both
(the Trainer cases run before accelerate's, fresh and then resumed, as they would alone).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch

VOCAB, SEQUENCE, SAMPLES, STEPS, SAVE_AT = 64, 16, 48, 3, 2


def tiny_llama(seed: int = 0):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                         tie_word_embeddings=False)
    return LlamaForCausalLM(config)


class Tokens(torch.utils.data.Dataset):
    def __init__(self):
        generator = torch.Generator().manual_seed(1)
        self.ids = torch.randint(0, VOCAB, (SAMPLES, SEQUENCE), generator=generator)

    def __len__(self):
        return SAMPLES

    def __getitem__(self, index):
        return {"input_ids": self.ids[index], "labels": self.ids[index]}


def deepspeed_config(stage: int, offload: bool = False, optimizer: bool = False, accumulation="auto") -> dict:
    config = {"train_micro_batch_size_per_gpu": "auto", "train_batch_size": "auto",
              "gradient_accumulation_steps": accumulation, "gradient_clipping": "auto",
              "bf16": {"enabled": "auto"}, "steps_per_print": 1000,
              "zero_optimization": {"stage": stage, "stage3_gather_16bit_weights_on_model_save": True}}
    if offload:
        config["zero_optimization"]["offload_optimizer"] = {"device": "cpu"}
        if stage == 3:
            config["zero_optimization"]["offload_param"] = {"device": "cpu"}
        config["zero_force_ds_cpu_optimizer"] = False  # official: torch's AdamW on the host, not its C++ op
    if optimizer:
        config["optimizer"] = {"type": "AdamW", "params": {"lr": "auto", "weight_decay": "auto", "betas": "auto",
                                                           "eps": "auto", "torch_adam": True}}
    return config


# case -> (stage, offload, config optimizer, zero.Init, bf16, gradient accumulation)
TRAINER_CASES = {
    "trainer-s2": (2, False, False, False, False, 2),
    "trainer-s3": (3, False, False, False, False, 1),
    "trainer-s3-init": (3, False, False, True, False, 2),
    "trainer-s3-offload": (3, True, True, True, False, 1),
    "trainer-s2-offload": (2, True, True, False, False, 2),
    "trainer-s2-bf16": (2, False, False, False, True, 2),
    "trainer-s3-bf16": (3, False, False, True, True, 1),
}


def trainer_case(name: str, out: Path, resume_from: Path | None) -> dict:
    from transformers import Trainer, TrainingArguments

    stage, offload, optimizer, zero_init, bf16, accumulation = TRAINER_CASES[name]
    recorded: list[float] = []

    class RecordingTrainer(Trainer):
        """Records the loss of each micro-step as the Trainer computes it (rank's own)."""

        def training_step(self, *args, **kwargs):
            loss = super().training_step(*args, **kwargs)
            recorded.append(loss.item())
            return loss

    from transformers.integrations import is_deepspeed_zero3_enabled

    model = None if zero_init else tiny_llama()  # built before the arguments: no zero.Init
    arguments = TrainingArguments(
        output_dir=str(out), deepspeed=deepspeed_config(stage, offload, optimizer), per_device_train_batch_size=2,
        gradient_accumulation_steps=accumulation, max_steps=STEPS, learning_rate=1e-2, warmup_steps=1,
        weight_decay=0.01, bf16=bf16, logging_steps=1, save_strategy="steps", save_steps=SAVE_AT, report_to=[],
        seed=0, data_seed=0, dataloader_num_workers=0, use_cpu=True, disable_tqdm=True)
    built_under_init = zero_init and is_deepspeed_zero3_enabled()
    if zero_init:
        model = tiny_llama()  # the arguments hold the ZeRO-3 config now: built under deepspeed.zero.Init
    trainer = RecordingTrainer(model=model, args=arguments, train_dataset=Tokens())
    resume = resume_from / name / f"checkpoint-{SAVE_AT}" if resume_from else None
    trainer.train(resume_from_checkpoint=str(resume) if resume else None)
    trainer.save_model(str(out / "model"))
    return {"losses": recorded, "lrs": [entry["learning_rate"] for entry in trainer.state.log_history
                                        if "learning_rate" in entry],
            "zero_init": built_under_init}


def accelerate_case(name: str, out: Path) -> dict:
    import deepspeed
    from accelerate import Accelerator
    from accelerate.utils import DeepSpeedPlugin, DummyOptim, DummyScheduler

    with_config_optimizer = name == "accelerate-config-optimizer"
    config = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2, "gradient_clipping": 1.0,
              "zero_optimization": {"stage": 2}}
    if with_config_optimizer:
        config["optimizer"] = {"type": "AdamW", "params": {"lr": 1e-2, "weight_decay": 0.01, "torch_adam": True}}
        config["scheduler"] = {"type": "WarmupLR", "params": {"warmup_min_lr": 0, "warmup_max_lr": 1e-2,
                                                              "warmup_num_steps": 2}}
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(reset_partial_state=True)  # a Trainer case before made its own Accelerator
    GradientState._reset_state()
    accelerator = Accelerator(deepspeed_plugin=DeepSpeedPlugin(hf_ds_config=config))
    model = tiny_llama()
    loader = torch.utils.data.DataLoader(Tokens(), batch_size=2, shuffle=False)
    if with_config_optimizer:
        optimizer = DummyOptim(model.parameters())
        scheduler = DummyScheduler(optimizer)
    else:
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.01)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 / (step + 1))
    model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)
    if not isinstance(model, deepspeed.DeepSpeedEngine):
        raise SystemExit(f"accelerate did not build a DeepSpeed engine: {type(model)}")
    losses, lrs = [], []
    for batch, _ in zip(loader, range(STEPS * 2)):
        with accelerator.accumulate(model):
            loss = model(**batch).loss
            losses.append(loss.item())
            accelerator.backward(loss)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
        lrs.append(scheduler.get_last_lr()[0])
    state = accelerator.get_state_dict(model)
    if accelerator.is_main_process:
        torch.save(state, out / "state_dict.pt")
    return {"losses": losses, "lrs": lrs}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--cases", required=True)
    parser.add_argument("--resume-from", type=Path)
    parser.add_argument("--resumed-out", type=Path)
    args = parser.parse_args()
    rank = int(os.environ.get("RANK", 0))
    names = args.cases.split(",")
    trainers = [name for name in names if not name.startswith("accelerate")]
    if args.resumed_out is None:
        runs = [(name, args.out, args.resume_from) for name in trainers]
    else:
        runs = [(name, args.out, None) for name in trainers] + [(name, args.resumed_out, args.resume_from)
                                                                 for name in trainers]
    runs += [(name, args.out, None) for name in names if name.startswith("accelerate")]
    for name, root, resume_from in runs:
        out = root / name
        out.mkdir(parents=True, exist_ok=True)
        result = accelerate_case(name, out) if name.startswith("accelerate") else trainer_case(name, out, resume_from)
        (out / f"rank{rank}.json").write_text(json.dumps(result))
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
    # Official DeepSpeed keeps references to its process groups, so their gloo threads outlive
    # destroy_process_group() and can abort the interpreter's teardown (SIGABRT: 2 of 40 two-rank runs
    # on 2 loaded cores); leave without it, as zero_lab/harness/train.py does. (nano leaves no thread:
    # tests/clients/test_dropin_package.py.)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
