"""Asking official DeepSpeed what it supports here, in a child process (for `zero-lab doctor`).

A child, because importing deepspeed takes seconds and may fail; it runs with the environment a
launched run gets (`torchrun.launch_environment`), so its answer is the one a run would meet.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from zero_lab.cli.environment import cpu_cores
from zero_lab.launch import torchrun

OFFICIAL_PROBE = """
import json, deepspeed
from deepspeed.accelerator import get_accelerator
accelerator = get_accelerator()
print(json.dumps({"accelerator": accelerator.device_name(), "bf16": bool(accelerator.is_bf16_supported()),
                  "fp16": bool(accelerator.is_fp16_supported())}))
"""


def probe_official(device: str) -> dict:
    """Ask official DeepSpeed, in a child process with the harness's environment, what it supports."""
    env = torchrun.launch_environment(dict(os.environ), device, 1, cpu_cores())
    try:
        done = subprocess.run([sys.executable, "-c", OFFICIAL_PROBE], capture_output=True, text=True, env=env, timeout=120)
    except subprocess.TimeoutExpired:
        return {"error": "importing deepspeed took over 120 s"}
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        return {"error": (done.stderr.strip().splitlines() or ["no output"])[-1]}
    return json.loads(lines[-1])
