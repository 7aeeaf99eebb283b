"""The drop-in package: with zero_lab/dropin first on PYTHONPATH, `import deepspeed` is nano, with the
names DeepSpeed clients import, honest package metadata, and one-line refusals."""

import json

import pytest

from tests.clients.dropin import DROPIN, IMPLS, run_python, run_torchrun

PLAIN_SCRIPT = DROPIN.parents[1] / "tests" / "clients" / "plain_initialize.py"
PLAIN_CONFIG = {"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2, "steps_per_print": 100,
                "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "weight_decay": 0.01, "torch_adam": True}},
                "zero_optimization": {"stage": 2}}

PROBE = r"""
import importlib.metadata, json, sys, torch
import deepspeed
from deepspeed.runtime.zero import partition_parameters
from deepspeed.checkpoint.utils import clone_tensors_for_torch_save
from deepspeed.runtime.lr_schedules import VALID_LR_SCHEDULES
from deepspeed.utils import logger
from zero_lab.nano.facade.engine import NanoEngine
from zero_lab.nano import zero
from zero_lab.nano.facade import lr_schedules
official = [d.version for d in importlib.metadata.distributions()
            if d.metadata["Name"] == "deepspeed" and "nano" not in d.version]
deepspeed.init_distributed()
flat = torch.arange(10.0)
cloned = clone_tensors_for_torch_save({"a": [flat[2:4]], "b": (flat[:1], 3)})
refusals = {}
for module in ("deepspeed.pipe", "deepspeed.moe.layer", "deepspeed.runtime.sequence_parallel.ulysses_sp",
               "deepspeed.ops.aio", "deepspeed.ops.lion"):
    try:
        __import__(module)
    except ModuleNotFoundError as error:
        refusals[module] = str(error)
print("RESULT " + json.dumps({
    "file": deepspeed.__file__, "version": deepspeed.__version__,
    "metadata_version": importlib.metadata.version("deepspeed"), "official": official,
    "api_version": deepspeed.API_VERSION,
    "engine_is_nano": deepspeed.DeepSpeedEngine is NanoEngine and deepspeed.runtime.engine.DeepSpeedEngine is NanoEngine,
    "zero_is_nano": deepspeed.zero.Init is zero.Init and deepspeed.zero.GatheredParameters is zero.GatheredParameters
                    and partition_parameters.GatheredParameters is zero.GatheredParameters
                    and deepspeed.zero.register_external_parameter is zero.register_external_parameter
                    and partition_parameters.unregister_external_parameter is zero.unregister_external_parameter,
    "schedules": VALID_LR_SCHEDULES, "nano_schedules": list(lr_schedules.SCHEDULES),
    "comm": [deepspeed.comm.is_initialized(), deepspeed.comm.get_rank(), deepspeed.comm.get_world_size()],
    "cloned": [[t.untyped_storage().nbytes() for t in cloned["a"]], cloned["a"][0].tolist(),
               type(cloned["b"]).__name__, cloned["b"][1]],
    "arange_is_torch": partition_parameters._orig_torch_arange is torch.arange,
    "logger": logger.name, "accelerator": deepspeed.get_accelerator().device_name(0),
    "refusals": refusals}))
if torch.distributed.is_initialized():  # a gloo group alive at exit can abort the teardown (SIGABRT)
    torch.distributed.destroy_process_group()
"""

TEARDOWN = r"""
import gc, json, os, torch
import deepspeed
threads = lambda: sorted(open(f"/proc/self/task/{task}/comm").read().strip() for task in os.listdir("/proc/self/task"))
deepspeed.init_distributed()
model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))
engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=CONFIG)
engine.backward(engine(torch.randn(4, 8)).pow(2).mean())
engine.step()
# One collective through the group: a gloo worker thread runs it, and names itself pt_gloo_runloop
# when it starts, so once the call returns one such thread is named (nano skips collectives alone)
torch.distributed.all_reduce(torch.zeros(1))
before = threads()
torch.distributed.destroy_process_group()
gc.collect()
print("RESULT " + json.dumps({"before": before, "after": threads()}))
"""


def _result(completed) -> dict:
    assert completed.returncode == 0, completed.stderr[-3000:]
    line = [line for line in completed.stdout.splitlines() if line.startswith("RESULT ")]
    return json.loads(line[0].removeprefix("RESULT "))


@pytest.fixture(scope="module")
def probe():
    """One interpreter with the drop-in first on PYTHONPATH, as rank 0: (its output, what it found)."""
    completed = run_python("nano", PROBE, RANK="0")
    return completed, _result(completed)


def test_import_deepspeed_is_nano_with_the_names_clients_import(probe):
    completed, result = probe
    assert result["file"].startswith(str(DROPIN / "deepspeed"))
    assert result["engine_is_nano"] and result["zero_is_nano"]
    assert result["schedules"] == result["nano_schedules"] == ["WarmupLR", "WarmupDecayLR", "WarmupCosineLR"]
    assert result["comm"] == [True, 0, 1]
    assert result["cloned"] == [[8], [2.0, 3.0], "tuple", 3]  # a clone holds its own 2 floats, not the buffer
    assert result["arange_is_torch"] and result["logger"] == "DeepSpeed" and result["accelerator"] == "cpu"
    # rank 0 names the engine once
    engine_lines = [line for line in completed.stdout.splitlines() if line.startswith("[engine]")]
    assert engine_lines == [f"[engine] deepspeed=nano version=0.19.8+nano module={DROPIN.parent / 'nano'}"]


def test_package_metadata_is_nano_labelled_and_follows_the_installed_official_api(probe):
    """importlib.metadata (what transformers and accelerate read) finds the drop-in's metadata, not
    official's: the version of official DeepSpeed's API it follows, labelled +nano."""
    result = probe[1]
    assert result["version"] == result["metadata_version"] == "0.19.8+nano"
    assert result["official"] == [result["api_version"]]  # the official DeepSpeed installed beside it


@pytest.mark.slow  # imports transformers and accelerate: seconds
def test_clients_see_deepspeed_available_and_recent_enough():
    code = ("from transformers.integrations.deepspeed import is_deepspeed_available\n"
            "from transformers.utils.versions import require_version\n"
            "from accelerate.utils import is_deepspeed_available as accelerate_sees, compare_versions\n"
            "require_version('deepspeed>=0.9.3')\n"
            "print('RESULT', is_deepspeed_available(), accelerate_sees(), compare_versions('deepspeed', '>=', '0.18.2'),"
            " compare_versions('deepspeed', '<', '0.19.9'))\n")
    completed = run_python("nano", code, RANK="1")
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert "RESULT True True True True" in completed.stdout
    assert "[engine]" not in completed.stdout  # rank 1 stays quiet


def test_what_nano_does_not_implement_is_refused_in_one_line_on_import(probe):
    refusals = probe[1]["refusals"]
    expected = {"deepspeed.pipe": "pipeline parallelism", "deepspeed.moe.layer": "mixture of experts",
                "deepspeed.runtime.sequence_parallel.ulysses_sp": "sequence parallelism",
                "deepspeed.ops.aio": "NVMe offload", "deepspeed.ops.lion": "not provided by nano"}
    assert set(refusals) == set(expected)
    for module, feature in expected.items():
        assert feature in refusals[module] and "\n" not in refusals[module], refusals[module]
        refused = refusals[module].split(" ")[0].rstrip(":")  # the first missing module: `module` or a parent
        assert module.startswith(refused) and "--impl official" in refusals[module]


@pytest.mark.slow
@pytest.mark.official
def test_a_plain_initialize_script_runs_on_nano_as_on_official_under_torchrun(tmp_path):
    """The same unchanged script under torchrun, 2 ranks: nano through PYTHONPATH, then official."""
    config = tmp_path / "ds.json"
    config.write_text(json.dumps(PLAIN_CONFIG))
    losses = {}
    for impl in IMPLS:
        completed = run_torchrun(impl, 2, PLAIN_SCRIPT, ["--deepspeed_config", str(config)])
        assert completed.returncode == 0, completed.stderr[-3000:]
        losses[impl] = _result(completed)["losses"]
        assert ("[engine] deepspeed=nano" in completed.stdout) == (impl == "nano")
    assert len(losses["nano"]) == 8
    assert max(abs(a - b) for a, b in zip(losses["nano"], losses["official"])) < 1e-6, losses


def test_destroy_process_group_ends_the_gloo_threads_a_nano_script_started():
    """After `destroy_process_group()` no gloo thread is left to race the interpreter's teardown
    (where one can abort a finished script with SIGABRT): nano's `init_distributed` imports what the
    first optimizer imports before the group exists, so no module default argument holds the group
    (zero_lab/nano/facade/distributed.py). One rank; MASTER_PORT 0: the store binds a port the OS gives."""
    code = TEARDOWN.replace("CONFIG", repr(PLAIN_CONFIG))
    result = _result(run_python("nano", code, RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT="0"))
    assert "pt_gloo_runloop" in result["before"], result  # the worker that ran the all-reduce
    assert not [name for name in result["after"] if name.startswith(("pt_gloo", "gloo"))], result
