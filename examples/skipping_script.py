"""A stage-3 training script in which one rank runs a module the other skips (a multimodal model's
vision tower, fed only on the ranks whose batch has an image): at step 2 rank 1 alone runs `vision`.
At stage 3 each module's parameters are gathered by every rank together, so rank 1's gather of
`vision` meets rank 0's gather of `head`: gloo aborts the job ("Is there a distributed collective
mismatch in your code?"). `zero-lab doctor` reads the ranks' flight records and says where they parted.

    zero-lab compare --script examples/skipping_script.py --impls nano,official --stages 3 \
        --gpus 2 --device cpu --config docs/learn/configs/zero3-every-module-gathered.json -- --steps 3
"""

import argparse
import atexit
import os
import sys
import traceback

import torch


def leave_without_teardown() -> None:
    """As tests/clients/tiny_deepspeed_script.py: no interpreter teardown after official's threads."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


atexit.register(leave_without_teardown)

import deepspeed  # noqa: E402  (after the exit handler)

VOCAB = 64


class TwoTowerModel(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, 32)
        self.vision = torch.nn.Linear(32, 32)  # smaller than the head: the head's gather overflows it
        self.head = torch.nn.Linear(32, VOCAB)

    def forward(self, input_ids, with_image=False):
        hidden = self.embed(input_ids[:, :-1])
        if with_image:
            hidden = hidden + self.vision(hidden)
        logits = self.head(hidden)
        return torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), input_ids[:, 1:].reshape(-1))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--deepspeed_config", required=True)
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()
    rank = int(os.environ.get("RANK", 0))
    torch.manual_seed(0)
    model = TwoTowerModel()
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                           config=args.deepspeed_config)
    for step in range(1, args.steps + 1):
        generator = torch.Generator().manual_seed(step * 10 + rank)
        input_ids = torch.randint(0, VOCAB, (2, 9), generator=generator)
        loss = engine(input_ids=input_ids, with_image=step == 2 and rank == 1)
        engine.backward(loss)
        engine.step()


if __name__ == "__main__":
    try:
        main()
    except RuntimeError as error:  # torch's collective check (`--check-collectives`) fails the rank with exit code 1;
        if "Detected mismatch between collectives" not in str(error):  # without it, gloo's abort (SIGABRT) ends
            raise  # rank 1 and the exit handler above rank 0
        traceback.print_exc()
        sys.stderr.flush()
        os._exit(1)
