"""Shared pytest setup: the `cuda` marker skips cleanly where no GPU is usable (CI, laptops)."""
import os

# The float64 oracle runs many small matmuls: threads only add contention on small CI machines.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import pytest  # noqa: E402

import smla  # noqa: E402


def _gpu_ready():
    if not smla.cuda_available():
        return False, "no usable CUDA GPU (or smla built without CUDA)"
    try:
        import torch
    except ImportError:
        return False, "torch is not installed"
    if not torch.cuda.is_available():
        return False, "torch sees no CUDA device"
    return True, ""


def pytest_collection_modifyitems(config, items):
    ok, why = _gpu_ready()
    if ok:
        return
    skip = pytest.mark.skip(reason=why)
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)
