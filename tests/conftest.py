"""Suite-wide: a test that leaves a storage tracker's resize hook installed fails itself, instead
of failing whichever memory test happens to run after it; tests marked `gpu` are skipped where
torch sees no CUDA device (`pytest -m gpu` runs them on a GPU machine, as `make gpu-check` does);
under pytest-xdist (`make test`: two workers, one file at a time each) the longest files start first.
"""
import pytest
import torch


@pytest.fixture(autouse=True)
def no_tracker_left_installed():
    before = torch.UntypedStorage.resize_
    yield
    leaked = torch.UntypedStorage.resize_ is not before
    torch.UntypedStorage.resize_ = before
    assert not leaked, "this test left a LiveStorageTracker entered (its resize_ hook is still installed)"


# The files that take longest (torchrun launches, official DeepSpeed; CPU seconds measured on 2 cores
# by issue-25t, and the FSDP2 and ZeRO++ launch files added after), longest
# first. Under xdist a worker takes whole files in collection order; a long file taken last would
# run alone while the other worker idles, so these go first, then the other slow or official files,
# then the in-process ones, which fill the gaps. Order only: every test runs, as it would alone.
LONGEST_FIRST = [
    "tests/clients/test_clients.py",
    "tests/harness/test_train_torchrun.py",
    "tests/cli/test_compare_e2e.py",
    "tests/analysis/test_peak_memory.py",
    "tests/diagnosis/test_findings_from_runs.py",
    "tests/fsdp2/test_harness.py",
    "tests/zeropp/test_zeropp_bytes.py",
    "tests/cli/test_faults.py",
    "tests/clients/test_compare_script.py",
    "tests/diagnosis/test_mismatch_e2e.py",
    "tests/cli/test_multinode.py",
    "tests/clients/test_exec.py",
    "tests/nano/test_checkpoints.py",
    "tests/nano/test_official_parity.py",
]


def longest_first(items: list[pytest.Item]) -> list[pytest.Item]:
    """items, whole files moved (a file's tests keep their order): LONGEST_FIRST, then files with a
    slow or official test, then the rest, each group in collection order."""
    rank: dict[str, tuple[int, int]] = {}
    for item in items:
        path = item.nodeid.split("::")[0]
        heavy = "slow" in item.keywords or "official" in item.keywords
        group = (0, LONGEST_FIRST.index(path)) if path in LONGEST_FIRST else (1 if heavy else 2, 0)
        rank[path] = min(rank.get(path, group), group)
    return sorted(items, key=lambda item: rank[item.nodeid.split("::")[0]])  # stable


def pytest_collection_modifyitems(config, items):
    if hasattr(config, "workerinput"):  # a pytest-xdist worker; every worker sorts alike
        items[:] = longest_first(items)
    if torch.cuda.is_available():
        return
    no_gpu = pytest.mark.skip(reason="needs a CUDA GPU (run `pytest -m gpu` or `make gpu-check` on one)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(no_gpu)
