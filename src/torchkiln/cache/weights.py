"""The content of tensors for the cache's keys: a SHA-256 of each tensor's bytes, read in place where it can be.

A contiguous CPU tensor is hashed through a view of its storage (no copy); others are copied to a contiguous CPU
tensor first. hashlib releases the GIL while it hashes, so many weights are hashed on several threads at once.
"""
from __future__ import annotations

import concurrent.futures
import hashlib
import os
from collections.abc import Sequence

import torch

# Below this many bytes in all, one thread hashes them (SHA-256 runs at about 2 GB/s with SHA extensions): threads
# would save a few milliseconds of wall time and cost more CPU time (a 4-layer BERT's 14 MB: 7.1 ms on one thread,
# 8.5-9 ms of CPU on two).
PARALLEL_BYTES = 64 << 20


class Unkeyable(Exception):
    """Something a cached result depends on cannot be described exactly."""


def _bytes(t: torch.Tensor) -> memoryview:
    """The tensor's bytes, without a copy where it is a contiguous CPU tensor."""
    if t.layout != torch.strided or t.is_quantized or t.is_meta or not hasattr(t, "untyped_storage"):
        raise Unkeyable(f"a {t.layout}{' quantized' if t.is_quantized else ''} tensor on {t.device}")
    data = t.detach()
    if data.device.type != "cpu" or not data.is_contiguous():
        data = data.cpu().contiguous()
    if data.numel() == 0:
        return memoryview(b"")
    return memoryview(data.reshape(-1).view(torch.uint8).numpy())


def _sha256(t: torch.Tensor) -> str:
    return hashlib.sha256(_bytes(t)).hexdigest()


def describe_tensor(t: torch.Tensor, digest: str | None = None) -> str:
    """dtype, shape, strides and the SHA-256 of the contents (`digest` where it is known already)."""
    return f"tensor({str(t.dtype)}, {list(t.shape)}, {list(t.stride())}, {digest or _sha256(t)})"


def tensor_digests(tensors: Sequence[torch.Tensor]) -> list[str]:
    """`describe_tensor` of each tensor; hashed on several threads when they are large."""
    total = sum(t.numel() * t.element_size() for t in tensors)
    workers = min(os.cpu_count() or 1, 8)
    if total < PARALLEL_BYTES or workers == 1 or len(tensors) == 1:
        return [describe_tensor(t) for t in tensors]
    # largest first, so that the threads finish together
    order = sorted(range(len(tensors)), key=lambda i: -tensors[i].numel() * tensors[i].element_size())
    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        found = dict(zip(order, pool.map(lambda i: _sha256(tensors[i]), order)))
    return [describe_tensor(t, found[i]) for i, t in enumerate(tensors)]
