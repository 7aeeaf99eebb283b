"""Per-rank body for the temporaries of ZeRO++'s quantized collectives at W=4 in nodes of 2, on the tiny
preset as `zero-lab explain` models it (zero3.json, the harness's parameter groups, fp32 and bf16, qwZ
and qgZ): the peak live bytes of every sharded buffer's quantized gather and of every gradient bucket's
quantized exchange, against the `temporary_bytes` explain predicts for them (and adds to its peak)."""

from __future__ import annotations

import gc

import torch

import zero_lab.nano as nano
from tests.backend_holding import backend_holding_collective_tensors
from zero_lab.nano.collectives import RANKS_PER_NODE_ENVIRONMENT
from zero_lab.nano.sharded_flat_buffer import BufferState
from zero_lab.nano.zeropp.quantized_gradients import QuantizedGradientReducer
from zero_lab.nano.zeropp.quantized_weights import QuantizedGathers

RANKS_PER_NODE = 2
KEYS = {"zero_quantized_weights": True, "zero_quantized_gradients": True}


def tiny_config(dtype: str, world_size: int):
    """(the config `zero-lab explain --model tiny --stage 3` reads, with qwZ and qgZ on; explain's
    walk-through of it at W=world_size in nodes of RANKS_PER_NODE, as JSON)."""
    import json
    import tempfile
    from pathlib import Path

    from zero_lab.cli.explain_cmd import explained_config

    settings = json.loads((Path(__file__).resolve().parents[2] / "harness" / "configs" / "zero3.json").read_text())
    settings["zero_optimization"].update(KEYS)
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "zero3.json"
        path.write_text(json.dumps(settings))
        built, typed, _ = explained_config(path, 3, dtype, "none", world_size)
    from zero_lab.analysis.explain.explain import explain
    from zero_lab.cli.explain_cmd import model_table

    return built, explain("tiny", *model_table("tiny"), typed, world_size, RANKS_PER_NODE).to_json()


def predicted_temporaries(walk: dict) -> tuple[list[tuple[int, int]], dict[str, int]]:
    """Explain's sharded buffers as (numel, padded numel), in the engine's order, and the temporary
    bytes it predicts for each collective holding some, by what it moves ("<buffer> int8" for a
    gather, "<buffer> bucket i/n int4, node" for an exchange)."""
    buffers = [(buffer["numel"], buffer["padded_numel"]) for buffer in walk["buffers"] if buffer["sharded"]]
    return buffers, {item["what"]: item["temporary_bytes"] for item in walk["collectives"] if item["temporary_bytes"]}


def peak_and_kept(tracker, call) -> tuple[int, int]:
    """(the most bytes alive while `call()` runs, the bytes alive after it), above what was alive
    when it started."""
    gc.collect()
    before = tracker.live_bytes
    tracker.reset_peak()
    call()
    return tracker.peak_bytes - before, tracker.live_bytes - before


def temporaries_worker(rank: int, world_size: int) -> list[str]:
    """For every sharded buffer of tiny (explain's, in the engine's order): one quantized gather holds
    its whole buffer and explain's `temporary_bytes` more at its peak, and keeps only the buffer; for
    every gradient bucket of it, one quantized exchange holds explain's `temporary_bytes` more and
    keeps nothing; exactly (live bytes tracked from outside the engine; every tensor handed to a
    collective held until the end, as a slow gloo thread would)."""
    import os

    from zero_lab.workload.meters.memory_meter import LiveStorageTracker
    from zero_lab.workload.models import build_model, parameter_groups

    os.environ[RANKS_PER_NODE_ENVIRONMENT] = str(RANKS_PER_NODE)
    failures = []
    for dtype in ("float32", "bfloat16"):
        config, walk = tiny_config(dtype, world_size)
        explained, temporaries = predicted_temporaries(walk)
        with LiveStorageTracker("cpu") as tracker, backend_holding_collective_tensors():
            model = build_model("tiny", seed=0)
            engine, *_ = nano.initialize(model=model, model_parameters=parameter_groups(model, 0.01), config=config)
            optimizer = engine.optimizer
            sharded = [buffer for buffer in optimizer.buffers if isinstance(buffer, QuantizedGathers)]
            if not isinstance(optimizer.reducer, QuantizedGradientReducer):
                failures.append(f"{dtype}: the gradient reducer is not qgZ's")
            if [(buffer.layout.numel, buffer.layout.padded_numel) for buffer in sharded] != explained:
                failures.append(f"{dtype}: the engine's sharded buffers are not explain's")
                continue
            names = [buffer["name"] for buffer in walk["buffers"] if buffer["sharded"]]
            for index, (buffer, name) in enumerate(zip(sharded, names)):
                assert buffer.state == BufferState.SHARDED
                measured, kept = peak_and_kept(tracker, lambda: buffer.unshard(optimizer.collectives))
                buffer.reshard()
                expected = buffer.full_nbytes + temporaries[f"{name} int8"]
                if (measured, kept) != (expected, buffer.full_nbytes):
                    failures.append(f"{dtype} buffer {index} {name}: a quantized "
                                    f"gather's peak {measured} B above its start, predicted {expected} B; "
                                    f"{kept} B kept, the whole buffer is {buffer.full_nbytes} B")
                ranges = buffer.layout.bucket_ranges(optimizer.config.zero_optimization.reduce_bucket_size)
                for number, (start, end) in enumerate(ranges, 1):
                    sizes = [high - low for low, high in buffer.layout.owner_ranges(start, end)]
                    generator = torch.Generator().manual_seed(index)
                    bucket = torch.randn(end - start, generator=generator).to(buffer.full.dtype)
                    share = torch.empty(sizes[rank], dtype=buffer.full.dtype)
                    measured, kept = peak_and_kept(tracker, lambda: optimizer.reducer.scatter(share, bucket, sizes, False))
                    expected = temporaries[f"{name} bucket {number}/{len(ranges)} int4, node"]
                    if (measured, kept) != (expected, 0):
                        failures.append(f"{dtype} {name} bucket {number}: a quantized exchange's "
                                        f"peak {measured} B above its start, predicted {expected} B; {kept} B kept")
    return failures
