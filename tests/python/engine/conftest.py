"""Fixtures for the engine tests (helpers live in engine_testlib.py)."""
import pytest
import torch


@pytest.fixture(autouse=True)
def _single_thread():
    """Tiny models on a shared 2-core CI box: intra-op threads only add contention (10x slower)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
