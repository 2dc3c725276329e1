"""NumPy -> torch for the CUDA twin tests: bf16 (as uint16 bits or ml_dtypes.bfloat16) travels as int16
bits and arrives as torch.bfloat16; every other dtype as itself. C-contiguous copies."""
import numpy as np


def to_torch(a, device="cuda"):
    import torch

    a = np.ascontiguousarray(a)
    if a.dtype == np.uint16 or a.dtype.name == "bfloat16":
        return torch.from_numpy(a.view(np.int16)).to(device).view(torch.bfloat16)
    return torch.from_numpy(a).to(device)
