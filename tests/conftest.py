"""Suite-wide guard: a test that leaves a storage tracker's resize hook installed fails itself,
instead of failing whichever memory test happens to run after it."""
import pytest
import torch


@pytest.fixture(autouse=True)
def no_tracker_left_installed():
    before = torch.UntypedStorage.resize_
    yield
    leaked = torch.UntypedStorage.resize_ is not before
    torch.UntypedStorage.resize_ = before
    assert not leaked, "this test left a LiveStorageTracker entered (its resize_ hook is still installed)"
