"""Benchmark: memory against wire bytes at stage 3 as `stage3_prefetch_bucket_size` and
`stage3_max_reuse_distance` vary, nano and official DeepSpeed measured side by side.

    .venv/bin/python bench/stage3_fetch_sweep.py                  # tiny, 2 CPU ranks, ~25 min on 2 loaded cores
    .venv/bin/python bench/stage3_fetch_sweep.py --model small --prefetch 0,3000000,50000000
    .venv/bin/python bench/stage3_fetch_sweep.py --plot reports/stage3-fetch-sweep.png

Phase 1: for each (prefetch, reuse distance), write the harness's zero3.json with those two keys
         and run one `zero-lab compare --stages 3 --config` (both impls, same model, data, seed).
Phase 2: print, per setting and impl, the median wire MB per step (all collectives; the
         reduce-scatters are the same for every setting, so what changes is the all-gathers) and
         the peak MB within a step. Both impls follow official's fetch rules (zero_lab/nano/policies/fetch_policy.py)
         at official's granularity (a unit per module's own parameters), so equal wire bytes are
         expected on every setting. With --plot, also draw peak MB against wire MB per step, one
         point per setting and impl.
"""

from __future__ import annotations

import json
import tempfile
from importlib import resources
from pathlib import Path

from compare_json import run_compare, workload_parser  # bench/compare_json.py


def config_with(prefetch: int, reuse: int, directory: Path) -> Path:
    config = json.loads(resources.files("zero_lab.harness").joinpath("configs/zero3.json").read_text())
    config["zero_optimization"].update(stage3_prefetch_bucket_size=prefetch, stage3_max_reuse_distance=reuse)
    path = directory / f"zero3-prefetch{prefetch}-reuse{reuse}.json"
    path.write_text(json.dumps(config))
    return path


def main() -> int:
    parser = workload_parser(__doc__.splitlines()[0], steps=3)
    parser.add_argument("--prefetch", default="0,100000,50000000", help="stage3_prefetch_bucket_size values")
    parser.add_argument("--reuse", default="0,1000000000", help="stage3_max_reuse_distance values")
    parser.add_argument("--plot", default=None, help="also write this PNG: peak MB against wire MB per step")
    args = parser.parse_args()
    points = []
    header = f"{'prefetch':>10}{'reuse':>12}  {'impl':<9}{'wire MB/step':>13}{'peak MB':>10}"
    print(header)
    print("-" * len(header))
    with tempfile.TemporaryDirectory() as directory:
        for prefetch in [int(value) for value in args.prefetch.split(",")]:
            for reuse in [int(value) for value in args.reuse.split(",")]:
                result = run_compare("--gpus", str(args.gpus), "--device", args.device, "--stages", "3", "--model",
                                     args.model, "--steps", str(args.steps),
                                     "--config", str(config_with(prefetch, reuse, Path(directory))))  # Phase 1
                for row in result["rows"]:  # Phase 2
                    points.append((row["impl"], prefetch, reuse, row.get("comm_wire_mb"), row.get("peak_alloc_max_mb")))
                    print(f"{prefetch:>10}{reuse:>12}  {row['impl']:<9}{row.get('comm_wire_mb') or float('nan'):>13.3f}"
                          f"{row.get('peak_alloc_max_mb') or float('nan'):>10.2f}", flush=True)
    if args.plot:
        plot(points, args.model, Path(args.plot))
    return 0


def plot(points: list[tuple], model: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot

    figure, axes = pyplot.subplots(figsize=(7, 4.5))
    for impl, marker in (("nano", "o"), ("official", "s")):
        mine = [point for point in points if point[0] == impl and point[3] and point[4]]
        axes.scatter([point[3] for point in mine], [point[4] for point in mine], marker=marker, label=impl)
        for _, prefetch, reuse, wire, peak in mine:
            axes.annotate(f"p={prefetch:.0e} r={reuse:.0e}", (wire, peak), fontsize=7, xytext=(4, 4),
                          textcoords="offset points")
    axes.set_xlabel("wire MB per step (all collectives)")
    axes.set_ylabel("peak MB within a step")
    axes.set_title(f"stage 3, {model}: stage3_prefetch_bucket_size (p) and stage3_max_reuse_distance (r)")
    axes.legend()
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)


if __name__ == "__main__":
    raise SystemExit(main())
