"""Run a test function on N gloo ranks started from pytest, and gather every rank's verdict.

Phase 1: start the rendezvous store here, on a port of 127.0.0.1 that the OS gives it while it
         binds (a port probed free and bound later can be taken in between by a test run beside
         this one), and start N processes (one thread each: 2 cores here).
         They fork from multiprocessing's forkserver, a clean process started once per pytest
         session that has already imported torch and nano's engine (`tests/forkserver_preload.py`):
         a fresh interpreter per rank spent 11-26 s a world importing them (measured on 2 loaded
         cores), a fork takes well under a second.
         Each world is still new processes with nothing of another test's; what a rank reads
         from the environment is set in `_entry` (the forkserver's own environment is the one
         pytest had when the first world started).
Phase 2: each joins a gloo group, runs `worker(rank, world_size, *args)` -> list of failure strings.
Phase 3: failures are all-gathered so every rank reports the union (all ranks fail together); the
         process group is destroyed in `finally`, after a barrier, and the process leaves without
         interpreter finalization (where gloo's leftover work objects can abort it). A crash
         before a rank reported, or a hang, is a failure; an exit code after every verdict is in
         is reported on stderr.
"""

from __future__ import annotations

import multiprocessing
import os
import queue
import sys
import time
import traceback
from typing import Any, Callable

import torch
import torch.distributed


def _entry(worker: Callable, rank: int, world_size: int, port: int, results: Any, args: tuple) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    store = torch.distributed.TCPStore("127.0.0.1", port, world_size, is_master=False)
    torch.distributed.init_process_group("gloo", store=store, rank=rank, world_size=world_size)
    try:
        try:
            failures = list(worker(rank, world_size, *args))
        except Exception:  # a rank's crash is its verdict, shared with the others
            failures = [f"rank {rank} raised:\n{traceback.format_exc()}"]
        everyone: list = [None] * world_size
        torch.distributed.all_gather_object(everyone, failures)
        results.put((rank, [failure for rank_failures in everyone for failure in rank_failures]))
        torch.distributed.barrier()
    finally:
        torch.distributed.destroy_process_group()
        # As harness/train.py: skip interpreter finalization, where gloo's leftover work objects
        # can abort the process; flush the result queue first.
        results.close()
        results.join_thread()
        os._exit(0)


PRELOADED = ["tests.forkserver_preload"]  # imported once in the forkserver: what every rank starts with


def _context() -> multiprocessing.context.BaseContext:
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(PRELOADED)  # read when the forkserver starts, at the first world
    return context


def run_distributed(worker: Callable, world_size: int, *args: Any, timeout: float = 600) -> list[str]:
    """The union of all ranks' failure messages (empty: every rank passed)."""
    context = _context()
    results = context.Queue()
    store = torch.distributed.TCPStore("127.0.0.1", 0, world_size, is_master=True, wait_for_workers=False)
    port = store.port
    processes = [context.Process(target=_entry, args=(worker, rank, world_size, port, results, args))
                 for rank in range(world_size)]
    for process in processes:
        process.start()
    verdicts: dict[int, list[str]] = {}
    deadline = time.monotonic() + timeout
    try:
        while len(verdicts) < world_size:
            try:
                rank, failures = results.get(timeout=1.0)
                verdicts[rank] = failures
                continue
            except queue.Empty:
                pass
            silent = [rank for rank, process in enumerate(processes)
                      if process.exitcode is not None and rank not in verdicts]
            if silent:
                return [f"rank {rank} exited with {processes[rank].exitcode} before reporting" for rank in silent]
            if time.monotonic() > deadline:
                return [f"timed out after {timeout}s; ranks that reported: {sorted(verdicts)}"]
    finally:
        for process in processes:
            process.join(timeout=30)
            if process.is_alive():
                process.kill()
    for rank, process in enumerate(processes):
        if process.exitcode not in (0, None):
            print(f"note: rank {rank} exited with {process.exitcode} after reporting its verdict", file=sys.stderr)
    return verdicts.get(0, [])
