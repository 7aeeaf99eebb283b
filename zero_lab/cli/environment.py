"""What a run ran on: versions, device, CPU and GPU model (saved as env.json, shown by doctor)."""

from __future__ import annotations

import os
import platform
import sys
from importlib import metadata


def package_version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cpu_cores() -> int:
    """Cores this process may use (the affinity mask, not the machine's total)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


# A Linux machine without one of these has no GPU driver loaded, so torch could see no CUDA (or
# ROCm) device: the answer is known without importing torch, seconds of every command's start-up.
GPU_DRIVER_PATHS = ("/proc/driver/nvidia", "/dev/nvidiactl", "/dev/kfd")


def cuda_devices() -> list[str]:
    """The names of the CUDA devices torch sees (none without a GPU driver)."""
    if sys.platform == "linux" and not any(os.path.exists(path) for path in GPU_DRIVER_PATHS):
        return []
    import torch

    if not torch.cuda.is_available():
        return []
    return [torch.cuda.get_device_name(index) for index in range(torch.cuda.device_count())]


DEVICES = ("auto", "cpu", "cuda")


AUTO_ON_CPU_NOTE = ("note: --device auto found no CUDA device, so this runs on the CPU; "
                    "pass --device cpu to say so, or --device cuda to insist on GPUs")


def resolve_device_name(device: str) -> str:
    """auto: cuda when a CUDA device is visible, else cpu (device already checked against DEVICES)."""
    if device != "auto":
        return device
    return "cuda" if cuda_devices() else "cpu"


def say_where_auto_runs(requested: str, resolved: str) -> None:
    """Once the input is checked and something is about to start: one line on stderr when --device
    auto fell back to the CPU (`AUTO_ON_CPU_NOTE`); nothing for a device the user named."""
    if requested == "auto" and resolved == "cpu":
        print(AUTO_ON_CPU_NOTE, file=sys.stderr)


def environment(device: str) -> dict[str, object]:
    gpus = cuda_devices()
    return {
        "python": platform.python_version(),
        "torch": package_version("torch"),
        "deepspeed": package_version("deepspeed"),
        "transformers": package_version("transformers"),
        "accelerate": package_version("accelerate"),
        "numpy": package_version("numpy"),
        "pandas": package_version("pandas"),
        "pydantic": package_version("pydantic"),
        "zero-lab": package_version("zero-lab"),
        "platform": platform.platform(),
        "device": device,
        "cpu": cpu_model(),
        "cpu_cores": cpu_cores(),
        "gpus": ", ".join(gpus) if gpus else "none",
    }
