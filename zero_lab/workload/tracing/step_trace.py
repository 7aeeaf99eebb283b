"""One rank of `zero-lab explain --measure`: nano on the `tiny` preset for two optimizer steps on
CPU (gloo), recording the second step's collectives and what the rank holds at each moment.

    RANK=0 WORLD_SIZE=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=29511 \
        .venv/bin/python -m zero_lab.workload.tracing.step_trace '{"config": {...}, "seq_len": 32}'

Phase 1: join the gloo group (MASTER_ADDR/MASTER_PORT, RANK, WORLD_SIZE from the environment),
         install the comm meter (before the engine, as the harness does) and build nano's engine
         on the preset with the harness's parameter groups and the given config.
Phase 2: step 1 runs unrecorded: it creates the optimizer states and, at stage 3, records the
         order of uses that a steady step follows.
Phase 3: step 2, recorded: every collective in order, labelled with the engine call it ran in
         (forward, backward, step), and `engine.memory_breakdown()` at the end of the first
         forward, at the end of the last backward, when Adam starts (a hook on the engine's Adam)
         and after the step.
Rank 0 prints the record as one JSON line; every rank leaves without interpreter finalization
(see harness/train.py).
"""

from __future__ import annotations

import json
import os
import sys

import torch
import torch.distributed as dist

import zero_lab.nano as nano
from zero_lab.workload.meters.comm_meter import CommMeter
from zero_lab.workload.models import build_model, parameter_groups

PRESET = "tiny"


def record_step(engine, comm: CommMeter, micro_batches: list[torch.Tensor]) -> dict:
    """Phase 3: one optimizer step, its collectives by engine call and its moments."""
    memory: dict[str, dict] = {}
    adam = engine.optimizer.partition_optimizer
    adam_step = adam.step

    def sampled_adam_step(*args, **kwargs):
        memory["optimizer_step"] = engine.memory_breakdown()
        return adam_step(*args, **kwargs)

    adam.step = sampled_adam_step
    calls: dict[str, list] = {"forward": [], "backward": [], "step": []}
    try:
        for index, tokens in enumerate(micro_batches):
            comm.trace = calls["forward"]
            loss = engine(input_ids=tokens, labels=tokens).loss
            if index == 0:
                memory["end_of_forward"] = engine.memory_breakdown()
            comm.trace = calls["backward"]
            engine.backward(loss)
            if index == len(micro_batches) - 1:
                memory["end_of_backward"] = engine.memory_breakdown()
            comm.trace = calls["step"]
            engine.step()
    finally:
        comm.trace = None
        adam.step = adam_step
    memory["between_steps"] = engine.memory_breakdown()
    return {"collectives": {call: [{"op": op, "payload_bytes": payload, "wire_bytes": wire} for op, payload, wire in made]
                            for call, made in calls.items()},
            "memory": memory}


def main(request: dict) -> dict:
    dist.init_process_group("gloo")
    comm = CommMeter().install()
    try:
        config = request["config"]
        model = build_model(PRESET, seed=0, dtype=request["dtype"])
        weight_decay = config.get("optimizer", {}).get("params", {}).get("weight_decay", 0.0)
        engine, _, _, _ = nano.initialize(model=model, model_parameters=parameter_groups(model, weight_decay),
                                          config=config)
        generator = torch.Generator().manual_seed(dist.get_rank())
        vocab = model.config.vocab_size
        micro = engine.gradient_accumulation_steps()
        batch = [torch.randint(0, vocab, (config["train_micro_batch_size_per_gpu"], request["seq_len"]),
                               generator=generator) for _ in range(micro)]
        with comm.paused():  # Phase 2
            for tokens in batch:
                engine.backward(engine(input_ids=tokens, labels=tokens).loss)
                engine.step()
        return record_step(engine, comm, batch)
    finally:
        comm.uninstall()


if __name__ == "__main__":
    torch.set_num_threads(1)
    exit_code = 0
    try:
        record = main(json.loads(sys.argv[1]))
        if dist.get_rank() == 0:
            print(json.dumps(record), flush=True)
        dist.barrier()
    except Exception as error:  # the CLI shows each rank's last line
        print(f"rank {os.environ.get('RANK')}: {type(error).__name__}: {error}", file=sys.stderr, flush=True)
        exit_code = 1
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(exit_code)
