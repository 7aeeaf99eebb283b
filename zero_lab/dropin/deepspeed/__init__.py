"""`import deepspeed`, answered by zero-lab's nano engine (`zero_lab.nano`).

Put this package's folder first on the module path and a DeepSpeed client runs on nano unchanged:

    PYTHONPATH=/path/to/zero-lab/zero_lab/dropin torchrun --nproc_per_node 2 train.py --deepspeed_config ds.json

(`zero-lab exec --impl nano -- torchrun ...` sets it for you.) The folder also holds this package's
metadata (`deepspeed-<version>.dist-info`), so `importlib.metadata.version("deepspeed")`, which the
Hugging Face Trainer and accelerate check, reads nano's version: DeepSpeed's API version it follows,
with the local label `+nano`.

Every name is nano's own code under DeepSpeed's name, laid out as official DeepSpeed lays it out,
for what clients import:
    deepspeed.initialize, init_distributed, add_config_arguments, DeepSpeedEngine (nano's engine)
    deepspeed.comm                               torch.distributed under DeepSpeed's names
    deepspeed.zero (= deepspeed.runtime.zero)    Init, GatheredParameters, register_external_parameter,
                                                 partition_parameters
    deepspeed.runtime.lr_schedules               nano's schedules, VALID_LR_SCHEDULES
    deepspeed.accelerator.get_accelerator        the device nano computes on (CUDA or CPU)
    deepspeed.ops.adam                           DeepSpeedCPUAdam, FusedAdam: Adam with nano's math
    deepspeed.checkpoint.utils                   clone_tensors_for_torch_save
    deepspeed.utils                              logger, log_dist
What nano does not implement (pipeline, MoE, NVMe offload, sequence parallelism, ...) is refused
in one line when it is imported (`refusals.py`) or configured (nano's config).

On import, rank 0 says once which engine answers, as one `[engine]` line on stdout.
"""

import os
import sys

__version__ = "0.19.8+nano"
__version_major__, __version_minor__, __version_patch__ = 0, 19, 8
API_VERSION = "0.19.8"  # official DeepSpeed's release whose API and files nano follows

from zero_lab.nano.facade.distributed import init_distributed  # noqa: E402
from zero_lab.nano.facade.engine import NanoEngine as DeepSpeedEngine  # noqa: E402
from zero_lab.nano.facade.initialize import add_config_arguments, initialize  # noqa: E402

from deepspeed import accelerator, checkpoint, comm, ops, refusals, runtime, utils  # noqa: E402
from deepspeed.accelerator import get_accelerator  # noqa: E402
from deepspeed.runtime import lr_schedules, zero  # noqa: E402

__all__ = ["initialize", "init_distributed", "add_config_arguments", "DeepSpeedEngine", "comm", "zero",
           "accelerator", "get_accelerator", "checkpoint", "ops", "runtime", "utils", "lr_schedules"]

refusals.install()


def _announce() -> None:
    """Rank 0 (torchrun's RANK; a single process is rank 0) names the engine, once per process."""
    if os.environ.get("RANK", "0") == "0":
        engine_dir = os.path.dirname(sys.modules["zero_lab.nano"].__file__)
        print(f"[engine] deepspeed=nano version={__version__} module={engine_dir}", flush=True)


_announce()
