"""Benchmark: what CUDA's caching allocator would reserve for a run, replayed from the run's own
allocations on CPU, beside what the committed GPU reports measured.

    .venv/bin/python bench/cuda_reserved.py --report reports/cuda-reserved.md   # ~40 min on 2 cores
    .venv/bin/python bench/cuda_reserved.py --impls fsdp2 --stages 2 --segments   # what holds each segment

Phase 1: per impl and stage, one rank of the harness runs on CPU (world size 1) with the memory meter's
         storage tracker told every allocation, resize and free from before the model is built to the
         last step (`LiveStorageTracker.listener`); the events are kept in order, each allocation
         with the stream it is made on (the side streams an engine makes, `torch.cpu.Stream`, and
         enters, `torch.cpu.stream`: FSDP2's all-gather and reduce-scatter streams; 0 the default),
         and official's `empty_cache` calls (its accelerator's, a no-op on CPU).
Phase 2: the events replay through `analysis.memory.cuda.caching_allocator` (CUDA's rules: segments,
         rounding, best-fit reuse, splitting, a pool per stream, release only at `empty_cache`).
Phase 3: print the replay's peak allocated and reserved beside the report's `peak alloc MB` and
         `reserved MB` for the same impl and stage, reserved over peak both ways, and what `zero-lab
         estimate` predicts before any run (`predicted_reserved_mb_by_impl`: the named terms of
         zero_lab/analysis/memory/cuda/cached.py) with its error against the GPU's.
The child runs what the GPU would: torch's AdamW fused (official's FusedAdam on a GPU makes no
temporaries either), and bf16 matrix products computed in fp32 below the tracker (this CPU's bf16 gemm is
a reference loop; the products' outputs, all the tracker sees, are the same tensors).
What a CPU run cannot show: kernels' own workspaces (cuBLAS, about 64 MB on the GPU), CPU kernels whose
outputs differ from CUDA's, and with offload which tensors a GPU would hold (every one is a CPU tensor
here): runs without offload only.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

MB = 2**20
REPORT = "gpu-check.md"  # the GPU's runs without offload

# Run in the child: the harness's training, its storage tracker told every change (Phase 1).
CHILD = """
import contextlib, os, pickle, sys
import torch
from zero_lab.workload.meters import memory_meter
events, live, streams, current = [], {}, {}, [0]
def listen(key, added, running, storage):
    if storage is None:
        live.pop(key, None); events.append((key, -1, 0, ""))
        return
    if key in live:
        events.append((key, -1, 0, ""))
    live[key] = storage.nbytes()
    events.append((key, storage.nbytes(), current[0], origin(storage.nbytes())))
ORIGINS = ("deepspeed/", "zero_lab/nano", "zero_lab/fsdp2", "_fully_shard", "transformers/", "torch/optim",
           "zero_lab/harness")
def origin(nbytes):  # where a tensor of 8 MiB or more was made: the innermost frame of an engine, model, optimizer
    if nbytes < 8 * 2**20:
        return ""
    frame = sys._getframe(2)
    while frame is not None:
        name = frame.f_code.co_filename
        if any(part in name for part in ORIGINS):
            return name.rsplit("/", 1)[-1] + ":" + frame.f_code.co_name
        frame = frame.f_back
    return "?"
original = memory_meter.LiveStorageTracker.__init__
def init(self, *args, **kwargs):
    original(self, *args, **kwargs)
    self.listener = listen
memory_meter.LiveStorageTracker.__init__ = init
class Stream(torch.cpu.Stream):  # a side stream the engine makes: its own pool on CUDA
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        streams[id(self)] = len(streams) + 1
plain_stream_context = torch.cpu.stream
@contextlib.contextmanager
def stream(chosen):
    previous, current[0] = current[0], streams.get(id(chosen), 0)
    try:
        with plain_stream_context(chosen):
            yield
    finally:
        current[0] = previous
torch.cpu.Stream, torch.cpu.stream = Stream, stream
# The model is built in the host's memory and then moved: on a GPU only the move allocates on the device.
from zero_lab.harness import train as harness
def build_model(*args, **kwargs):
    events.append((None, 0, -2, "building"))
    try:
        return harness_build_model(*args, **kwargs)
    finally:
        events.append((None, 0, -3, "built"))
harness_build_model, harness.build_model = harness.build_model, build_model
# bf16 matrix products in fp32 below the tracker (it sees the op's bf16 output alone): this CPU's bf16 gemm
# is a reference loop, about 60 times slower than its fp32 one, and the sizes are what the replay needs.
products = torch.library.Library("aten", "IMPL")
def in_fp32(op, shape_of):
    def kernel(*tensors, **options):
        dtype = tensors[-1].dtype
        wide = torch.float32 if dtype == torch.bfloat16 else dtype
        out = torch.empty(shape_of(*tensors[-2:]), dtype=wide)
        op(*(t.to(wide) for t in tensors), **options, out=out)
        return out.to(dtype)
    return kernel
products.impl("mm", in_fp32(torch.ops.aten.mm.out, lambda a, b: (a.shape[0], b.shape[1])), "CPU")
products.impl("addmm", in_fp32(torch.ops.aten.addmm.out, lambda a, b: (a.shape[0], b.shape[1])), "CPU")
products.impl("bmm", in_fp32(torch.ops.aten.bmm.out, lambda a, b: (a.shape[0], a.shape[1], b.shape[2])), "CPU")
# torch's AdamW fused, as official's FusedAdam on a GPU: no temporaries (on CPU its default makes two
# fp32 copies of each tensor, here the whole partition).
adamw_init = torch.optim.AdamW.__init__
def fused_adamw(self, *args, **kwargs):
    adamw_init(self, *args, **(kwargs | {"fused": True, "foreach": None}))
torch.optim.AdamW.__init__ = fused_adamw
try:
    from deepspeed.accelerator.cpu_accelerator import CPU_Accelerator
    CPU_Accelerator.empty_cache = lambda self: events.append((None, 0, -1, ""))
except ImportError:
    pass
sys.argv = ["train.py"] + sys.argv[2:]
from zero_lab.harness.train import main
code = main()
with open(OUT, "wb") as out:
    pickle.dump(events, out)
sys.stdout.flush()
os._exit(code)  # as the harness leaves (run_as_script)
"""


def free_port() -> int:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        return listener.getsockname()[1]


def capture(impl: str, stage: int, args: argparse.Namespace, out: Path) -> list[tuple]:
    """Phase 1: the events of one CPU rank of `impl` at `stage`."""
    config = json.loads((ROOT / "harness" / "configs" / f"zero{min(stage, 3)}.json").read_text())
    config["zero_optimization"]["stage"] = stage
    config["bf16"] = {"enabled": args.dtype == "bfloat16"}
    config_path = out.with_suffix(".json")
    config_path.write_text(json.dumps(config))
    environment = dict(os.environ, RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1",
                       MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), DS_ACCELERATOR="cpu")
    command = [sys.executable, "-c", CHILD.replace("OUT", repr(str(out))), "--", "--impl", impl,
               "--deepspeed_config", str(config_path), "--zero-stage", str(stage), "--device", "cpu",
               "--model-name", args.model, "--model-dtype", args.dtype, "--steps", str(args.steps), "--seed", "42",
               "--batch-size", str(args.batch_size), "--seq-len", str(args.seq_len)]
    done = subprocess.run(command, cwd=ROOT, env=environment, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{impl} stage {stage}: the run failed:\n{done.stderr[-3000:]}")
    return pickle.loads(out.read_bytes())


def replay(events: list[tuple]):
    """Phase 2: (key, bytes, stream, origin) an allocation, (key, -1, 0, "") a free, (None, 0, -1, "")
    `empty_cache`, (None, 0, -2 / -3, "") the model's build beginning and ending: its tensors are made in the
    host's memory, and on a GPU the move after it allocates those alive then, in the order they were made."""
    from zero_lab.analysis.memory.cuda.caching_allocator import CachingAllocatorModel

    allocator, building, built = CachingAllocatorModel(), False, {}
    for key, nbytes, stream, origin in events:
        if stream == -2:
            building = True
        elif stream == -3:
            building = False
            for made, (size, where) in built.items():
                allocator.allocate(made, size, 0, where or "the model's move to the device")
        elif building:
            if nbytes < 0:
                built.pop(key, None)
            else:
                built[key] = (nbytes, "the model's move to the device")
        elif stream == -1:
            allocator.empty_cache()
        elif nbytes < 0:
            allocator.free(key)
        else:
            allocator.allocate(key, nbytes, stream, origin)
    return allocator


def measured(impl: str, stage: int) -> tuple[float, float] | None:
    """The report's peak alloc and reserved MB of `impl` at `stage` (its comparison table), when it has them;
    not nano's, measured before its step changed."""
    if impl == "nano":
        return None
    path = ROOT / "reports" / REPORT
    marker = f"## world size 1, stage {stage}:"
    if not path.exists() or marker not in path.read_text():
        return None
    lines = [line for line in path.read_text().split(marker, 1)[1].split("\n## ", 1)[0].splitlines()
             if line.startswith("|")]
    cells = [[cell.strip() for cell in line.strip("|").split("|")] for line in lines]
    header, rows = cells[0], {row[0]: row for row in cells[2:]}
    if impl not in header:
        return None
    column = header.index(impl)
    return float(rows["peak alloc MB"][column]), float(rows["reserved MB"][column])


def estimate(impl: str, stage: int, args: argparse.Namespace) -> float | None:
    """What `zero-lab estimate` predicts `impl` reserves on one GPU for the same run (None: no prediction)."""
    command = [str(Path(sys.executable).parent / "zero-lab"), "estimate", "--model", args.model, "--gpus", "1",
               "--stages", str(stage), "--dtype", args.dtype, "--seq-len", str(args.seq_len), "--micro-batch",
               str(args.batch_size), "--impls", impl, "--device", "cuda", "--format", "json"]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=True)
    return json.loads(done.stdout)["rows"][0]["predicted_reserved_mb_by_impl"][impl]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--impls", default="official,fsdp2,nano")
    parser.add_argument("--stages", default="2,3")
    parser.add_argument("--model", default="qwen3-0.6b")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--batch-size", type=int, default=1)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--keep", type=Path, help="keep each run's events here, and replay those found there "
                                                   "instead of running again")
    parser.add_argument("--segments", action="store_true", help="also list the segments held, by what made them")
    parser.add_argument("--report", type=Path, help="also write the table as markdown here (reports/cuda-reserved.md)")
    args = parser.parse_args()
    print("impl       stage  replayed peak MB  reserved MB  reserved/peak | GPU peak MB  reserved MB  reserved/peak"
          " | estimate MB  error %")
    table = []
    with tempfile.TemporaryDirectory() as scratch:
        for impl in args.impls.split(","):
            for stage in map(int, args.stages.split(",")):
                out = (args.keep or Path(scratch)) / f"{impl}-{stage}-{args.model}.pkl"
                out.parent.mkdir(parents=True, exist_ok=True)
                events = (pickle.loads(out.read_bytes()) if out.exists()
                          else capture(impl, stage, args, out))
                allocator = replay(events)
                peak, reserved = allocator.peak_allocated / MB, allocator.peak_reserved / MB
                line = f"{impl:10} {stage:5}  {peak:16.1f}  {reserved:11.1f}  {reserved / peak:13.3f}"
                gpu, estimated = measured(impl, stage), estimate(impl, stage, args)
                line += (f" | {gpu[0]:11.1f}  {gpu[1]:11.1f}  {gpu[1] / gpu[0]:13.3f}" if gpu else " |" + " " * 41)
                if estimated is not None:
                    error = f"{100 * (estimated - gpu[1]) / gpu[1]:+8.1f}" if gpu else ""
                    line += f" | {estimated:11.1f} {error}"
                print(line, flush=True)
                table.append((impl, stage, peak, reserved, gpu, estimated))
                if args.segments:
                    print_segments(allocator)
    if args.report:
        write_report(args.report, table, args)
    return 0


def write_report(path: Path, table: list[tuple], args: argparse.Namespace) -> None:
    """Phase 3's table as markdown: each row's replay and estimate beside the GPU's figures, errors against
    the GPU's reserved bytes."""
    def error(value: float | None, gpu) -> str:
        return f"{100 * (value - gpu[1]) / gpu[1]:+.1f}" if value is not None and gpu else "-"

    lines = ["# What CUDA's caching allocator reserves: replayed on CPU, estimated, measured on a GPU", "",
             f"{args.model}, {args.dtype}, micro-batch {args.batch_size} of {args.seq_len} tokens, one rank, "
             f"{args.steps} steps, no offload (`bench/cuda_reserved.py`; the GPU's figures: reports/gpu-check.md).", "",
             "| impl | stage | replayed peak MB | replayed reserved MB | GPU peak MB | GPU reserved MB "
             "| replay error % | estimate MB | estimate error % |", "|---|---|---|---|---|---|---|---|---|"]
    for impl, stage, peak, reserved, gpu, estimated in table:
        measured = f"{gpu[0]:.1f} | {gpu[1]:.1f}" if gpu else "- | -"
        shown = f"{estimated:.1f}" if estimated is not None else "-"
        lines.append(f"| {impl} | {stage} | {peak:.1f} | {reserved:.1f} | {measured} | "
                     f"{error(reserved, gpu)} | {shown} | {error(estimated, gpu)} |")
    path.write_text("\n".join(lines) + "\n")


def print_segments(allocator) -> None:
    """The segments held at the end, summed by what made them (tensors under 8 MiB: their size class)."""
    by_origin: dict[str, list[int]] = {}
    for size, origin in allocator.segments.values():
        shared = {2 * MB: "2 MiB segments", 20 * MB: "20 MiB segments"}.get(size, "own segments")
        by_origin.setdefault(origin or f"under 8 MiB ({shared})", []).append(size)
    for origin, sizes in sorted(by_origin.items(), key=lambda item: -sum(item[1])):
        print(f"    {sum(sizes) / MB:10.1f} MB in {len(sizes):5} segments  {origin}")
    print(f"    reserved when the tensors peaked: {allocator.reserved_at_peak_allocated / MB:.1f} MB")

if __name__ == "__main__":
    sys.exit(main())
