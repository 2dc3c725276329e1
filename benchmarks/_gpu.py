"""Shared start of the GPU benchmarks: torch and an smla with a usable CUDA GPU, or a clear message."""


def open_gpu(name):
    """(torch, smla) when both can run on a GPU here; else print why (prefixed by name) and return None."""
    try:
        import torch
    except ImportError:
        print(f"{name}: torch is not installed; nothing to measure")
        return None
    import smla

    if not (torch.cuda.is_available() and smla.cuda_available()):
        print(f"{name}: no usable CUDA GPU (or smla built without CUDA); nothing to measure")
        return None
    return torch, smla
