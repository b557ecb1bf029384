"""Latency of a callable: warm-up, then one time per call (CUDA events on a GPU, the wall clock on the CPU); peers
timed interleaved in rounds, so that a burst of load on a shared machine falls on all of them; and a warning where
the rest of the machine was busy meanwhile (measured by `runtime/cpu_load.py`)."""
from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Mapping, Sequence

import torch

from torchkiln.runtime.cpu_load import LOADED

NOISY = 0.25  # interquartile range over median above which a peer's timing is called noisy


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


def time_interleaved(runners: Mapping[str, Callable[[], object]], device: torch.device, iters: int, warmup: int,
                     rounds: int = 5, settle_s: float = 0.05) -> dict[str, list[float]]:
    """Milliseconds of `iters` calls of each runner (at least one per round), after `warmup` untimed calls of each:
    in `rounds` rounds, each runner's share of calls in turn, the order rotated every round, so that no runner
    has the machine's quiet (or busy) moments to itself. On the CPU each share starts after `settle_s` seconds
    (the previous runner's spinning worker threads, ONNX Runtime's or OpenMP's, go idle) and one untimed call."""
    if iters < 1 or rounds < 1:
        raise ValueError(f"iters and rounds must be >= 1, got {iters} and {rounds}")
    names = list(runners)
    for name in names:
        for _ in range(warmup):
            runners[name]()
    per_round = max(1, math.ceil(iters / rounds))
    times: dict[str, list[float]] = {name: [] for name in names}
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            if device.type == "cpu" and len(names) > 1:
                time.sleep(settle_s)
                runners[name]()
            times[name] += time_calls(runners[name], device, per_round, 0)
    return times


def percentile(times: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100), linear between the nearest ranks."""
    ordered = sorted(times)
    pos = (len(ordered) - 1) * q / 100
    lo = math.floor(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def summarize(times: Sequence[float]) -> dict[str, float]:
    """p25, p50, p75, p90, p99, mean, min and max of times in ms."""
    return {"p25": percentile(times, 25), "p50": percentile(times, 50), "p75": percentile(times, 75),
            "p90": percentile(times, 90), "p99": percentile(times, 99), "mean": statistics.fmean(times),
            "min": min(times), "max": max(times)}


def relative_spread(stats: Mapping[str, float]) -> float:
    """Interquartile range over median of a `summarize` result."""
    return (stats["p75"] - stats["p25"]) / stats["p50"] if stats["p50"] > 0 else 0.0


def geomean(values: Sequence[float]) -> float:
    return math.exp(sum(map(math.log, values)) / len(values))


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def load_warning(other_load: float, spread: float | None = None) -> str | None:
    """A warning that timings are unreliable where other processes used more than LOADED of the CPU, or a timing's
    interquartile range exceeds NOISY of its median; else None."""
    reasons = []
    if other_load > LOADED:
        reasons.append(f"other processes used {other_load:.0%} of the machine's CPU time while timing")
    if spread is not None and spread > NOISY:
        reasons.append(f"eager's interquartile range is {spread:.0%} of its median")
    return f"the machine is loaded ({'; '.join(reasons)}): timings are noisy" if reasons else None
