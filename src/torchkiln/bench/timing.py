"""Latency of a callable: warm-up, then one time per call (CUDA events on a GPU, the wall clock on the CPU)."""
from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Sequence

import torch


def time_calls(fn: Callable[[], object], device: torch.device, iters: int, warmup: int) -> list[float]:
    """Milliseconds of each of `iters` calls of `fn`, after `warmup` untimed calls."""
    if iters < 1:
        raise ValueError(f"iters must be >= 1, got {iters}")
    for _ in range(warmup):
        fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(iters)]
        for start, end in events:
            start.record()
            fn()
            end.record()
        torch.cuda.synchronize(device)
        return [start.elapsed_time(end) for start, end in events]
    times = []
    for _ in range(iters):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return times


def percentile(times: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100), linear between the nearest ranks."""
    ordered = sorted(times)
    pos = (len(ordered) - 1) * q / 100
    lo = math.floor(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def summarize(times: Sequence[float]) -> dict[str, float]:
    """p50, p90, p99, mean, min and max of times in ms."""
    return {"p50": percentile(times, 50), "p90": percentile(times, 90), "p99": percentile(times, 99),
            "mean": statistics.fmean(times), "min": min(times), "max": max(times)}


def geomean(values: Sequence[float]) -> float:
    return math.exp(sum(map(math.log, values)) / len(values))


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
