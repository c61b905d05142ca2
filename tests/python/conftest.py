"""Shared fixtures: every test draws fresh random inputs from a seed it prints (FLASHTQ_TEST_SEED replays it)."""
import os
import random

import pytest
import torch

import flashtq


def _cuda_backend_ready() -> bool:
    return torch.cuda.is_available() and any(b.name == "cuda" and b.available for b in flashtq.backends())


CUDA_REASON = ("no CUDA run here: torch.cuda.is_available() is False or the extension was built without the cuda "
               "backend (nvcc not found)")
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not _cuda_backend_ready(), reason=CUDA_REASON))]


@pytest.fixture
def seed(request):
    value = int(os.environ.get("FLASHTQ_TEST_SEED", random.randrange(2**31)))
    print(f"\n{request.node.nodeid}: FLASHTQ_TEST_SEED={value} replays this test's inputs")
    torch.manual_seed(value)
    return value


@pytest.fixture
def gen(seed):
    return random.Random(seed)
