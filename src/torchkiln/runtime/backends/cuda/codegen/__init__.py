"""Triton source generated from layers (never stored in an engine: regenerated when an engine loads)."""
from __future__ import annotations

import functools
import importlib.util


@functools.cache
def have_triton() -> bool:
    """Whether Triton is installed (without it, the planner keeps every layer on ATen and the libraries)."""
    return importlib.util.find_spec("triton") is not None


@functools.cache
def multiprocessors(device: object) -> int:
    """A CUDA device's streaming multiprocessors; 0 for any other (Triton's interpreter, where launch sizes do not
    matter)."""
    import torch

    device = torch.device(device)
    return torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 0


def needs_int64(*tensors) -> bool:
    """Whether an element offset of any of `tensors` (over its strides) or its element count reaches 2**31, so a
    generated kernel must index in int64 (int32 indexing is cheaper)."""
    limit = 1 << 31
    for t in tensors:
        if t.numel() >= limit or sum((n - 1) * abs(s) for n, s in zip(t.shape, t.stride()) if n) >= limit:
            return True
    return False
