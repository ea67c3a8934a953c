"""What `arrays._torch_view` spends its ~6 us on: each step timed alone over 20,000 calls
on a contiguous float32 CUDA tensor (one process), beside the whole view and DLPack's.
    PYTHONPATH=. python exp/torch_view_parts.py
"""
import timeit

import cupy as cp
import numpy as np
import torch

from indexer import arrays

t = torch.randn(64, 128, device="cuda")
dtype = np.dtype(np.float32)
ptr, dev, span = t.data_ptr(), t.get_device(), t.numel() * 4
mem = cp.cuda.UnownedMemory(ptr, span, t, dev)
mp = cp.cuda.MemoryPointer(mem, 0)
shape = tuple(t.shape)
steps = {
    "t.dtype": lambda: t.dtype,
    "t.is_cuda": lambda: t.is_cuda,
    "t.layout": lambda: t.layout,
    "t.requires_grad": lambda: t.requires_grad,
    "t.is_neg()": lambda: t.is_neg(),
    "t.is_conj()": lambda: t.is_conj(),
    "t.numel()": lambda: t.numel(),
    "tuple(t.shape)": lambda: tuple(t.shape),
    "t.is_contiguous()": lambda: t.is_contiguous(),
    "t.data_ptr()": lambda: t.data_ptr(),
    "t.get_device()": lambda: t.get_device(),
    "UnownedMemory": lambda: cp.cuda.UnownedMemory(ptr, span, t, dev),
    "MemoryPointer": lambda: cp.cuda.MemoryPointer(mem, 0),
    "cp.ndarray(shape, dtype, mp)": lambda: cp.ndarray(shape, dtype, mp),
    "cp.ndarray(shape, np.float32, mp)": lambda: cp.ndarray(shape, np.float32, mp),
    "_torch_view": lambda: arrays._torch_view(cp, t),
    "to_cupy(ordered)": lambda: arrays.to_cupy(t, ordered=True),
    "cp.from_dlpack": lambda: cp.from_dlpack(t),
}
for _ in range(2):
    for name, fn in steps.items():
        n = 20000
        us = min(timeit.repeat(fn, number=n, repeat=3)) / n * 1e6
        print(f"{name:36s} {us:6.2f} us")
    print()
