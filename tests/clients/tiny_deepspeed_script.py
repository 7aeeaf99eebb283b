"""A user's DeepSpeed training script in miniature, for the `zero-lab exec` tests: it imports
`deepspeed` as any script does, says which one it got, trains a 2-layer model for --steps optimizer
steps of the config's accumulation, prints every micro-step's loss on every rank (the reference
the log contract's `[opt_step k] loss` must average), destroys its process group and exits with
--exit-code.

    zero-lab exec --impl nano --device cpu -- torchrun --nproc-per-node 2 tiny_deepspeed_script.py \
        --deepspeed_config ds.json --steps 3
"""

import argparse
import atexit
import json
import os
import sys

import torch

# Official DeepSpeed keeps references to its process groups, so their gloo threads outlive
# destroy_process_group() and can abort the interpreter's teardown (SIGABRT: 2 of 40 two-rank runs
# on 2 loaded cores). The script leaves without that teardown, as zero_lab/harness/train.py does,
# from an exit handler registered before deepspeed is imported: it runs after every handler a
# library registers later (the log contract's `[comm]`). nano leaves no thread
# (tests/clients/test_dropin_package.py). An uncaught exception has printed its traceback by then.
LEAVE = {"exit_code": 1}


def leave_without_teardown() -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(LEAVE["exit_code"])


atexit.register(leave_without_teardown)

import deepspeed  # noqa: E402  (after the exit handler: see above)

VOCAB = 64


class TinyModel(torch.nn.Module):
    """Embedding and head; its forward returns the next-token loss, as a Hugging Face model does."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, 32)
        self.head = torch.nn.Linear(32, VOCAB)

    def forward(self, input_ids):
        logits = self.head(self.embed(input_ids[:, :-1]))
        return torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), input_ids[:, 1:].reshape(-1))


def say(line: str) -> None:
    """One line in one write: the ranks share the terminal, and print() writes the newline apart."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--deepspeed_config", required=True)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--exit-code", type=int, default=0)
    args = parser.parse_args()
    rank = int(os.environ.get("RANK", 0))
    say(f"script-deepspeed rank={rank} file={deepspeed.__file__} accelerator={os.environ.get('DS_ACCELERATOR')}")
    with open(args.deepspeed_config) as handle:
        config = json.load(handle)
    torch.manual_seed(0)
    model = TinyModel()
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                           config=args.deepspeed_config)
    accumulation = config.get("gradient_accumulation_steps", 1)
    for step in range(1, args.steps + 1):
        for micro in range(accumulation):
            generator = torch.Generator().manual_seed(1000 * step + 10 * micro + rank)
            input_ids = torch.randint(0, VOCAB, (config["train_micro_batch_size_per_gpu"], 9), generator=generator)
            loss = engine(input_ids=input_ids)
            engine.backward(loss)
            engine.step()
            say(f"script-loss rank={rank} step={step} micro={micro} loss={loss.item():.9g}")
    torch.distributed.destroy_process_group()  # as PyTorch asks of every script
    return args.exit_code


if __name__ == "__main__":
    try:
        LEAVE["exit_code"] = main()
    except SystemExit as exiting:  # argparse's refusals keep their code
        LEAVE["exit_code"] = exiting.code if isinstance(exiting.code, int) else 1
        raise
