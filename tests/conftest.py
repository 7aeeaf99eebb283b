"""Suite-wide: a test that leaves a storage tracker's resize hook installed fails itself, instead
of failing whichever memory test happens to run after it; tests marked `gpu` are skipped where
torch sees no CUDA device (`pytest -m gpu` runs them on a GPU machine, as `make gpu-check` does)."""
import pytest
import torch


@pytest.fixture(autouse=True)
def no_tracker_left_installed():
    before = torch.UntypedStorage.resize_
    yield
    leaked = torch.UntypedStorage.resize_ is not before
    torch.UntypedStorage.resize_ = before
    assert not leaked, "this test left a LiveStorageTracker entered (its resize_ hook is still installed)"


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    no_gpu = pytest.mark.skip(reason="needs a CUDA GPU (run `pytest -m gpu` or `make gpu-check` on one)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(no_gpu)
