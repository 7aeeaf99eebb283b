"""A user's plain DeepSpeed script, unchanged for either engine: `import deepspeed`, initialize, train.

    torchrun --nproc_per_node 2 plain_initialize.py --deepspeed_config ds.json
Rank 0 prints one line, `RESULT {"losses": [...]}`: each micro-step's loss, averaged over ranks (4 optimizer
steps of 2 micro-steps).
"""

import argparse
import json
import os
import sys

import deepspeed
import torch

parser = deepspeed.add_config_arguments(argparse.ArgumentParser())
parser.add_argument("--local_rank", type=int, default=int(os.environ.get("LOCAL_RANK", 0)))
args = parser.parse_args()
deepspeed.init_distributed()
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))
engine, _, _, _ = deepspeed.initialize(args=args, model=model, model_parameters=model.parameters())
rank, world_size = deepspeed.comm.get_rank(), deepspeed.comm.get_world_size()
generator = torch.Generator().manual_seed(1)
losses = []
for micro_step in range(8):
    inputs = torch.randn(world_size, 4, 8, generator=generator)[rank]
    loss = (engine(inputs) - inputs.sum(dim=1, keepdim=True)).pow(2).mean()
    engine.backward(loss)
    engine.step()
    mean = loss.detach().clone()
    deepspeed.comm.all_reduce(mean)
    losses.append(mean.item() / world_size)
if rank == 0:
    print("RESULT " + json.dumps({"losses": losses}), flush=True)
torch.distributed.destroy_process_group()
# Official DeepSpeed keeps references to its process groups, so their gloo threads outlive
# destroy_process_group() and can abort the interpreter's teardown (SIGABRT: 2 of 40 two-rank runs
# on 2 loaded cores); leave without it, as zero_lab/harness/train.py does. (nano leaves no thread:
# tests/clients/test_dropin_package.py.)
sys.stdout.flush()
os._exit(0)
