"""CUDA graph capture, one at a time in the process.

`torch.cuda.graph` captures on one side stream per process, so two threads capturing at once would begin a capture
on a stream already capturing. And a capture in CUDA's global mode refuses the unsafe calls of every thread (another
engine's first, uncaptured call: cuBLAS creating its handle, Triton loading a module, the allocator growing), which
then also fail the capture. Four engines with attention called at once from four threads, on an H200: one capture
failed (that engine then ran step by step) and two calls raised. So captures hold `ONE_CAPTURE`, as does a runner's
whole first call (its uncaptured run may synchronize, which no capture anywhere in the process allows), and a
capture is thread-local: what other threads do meanwhile is theirs to do.
"""
from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

import torch

ONE_CAPTURE = threading.RLock()


@contextlib.contextmanager
def graph_capture(graph: torch.cuda.CUDAGraph, pool: object = None) -> Iterator[None]:
    """`torch.cuda.graph(graph, pool)`, thread-local, while no other thread captures."""
    with ONE_CAPTURE, torch.cuda.graph(graph, pool=pool, capture_error_mode="thread_local"):
        yield


@contextlib.contextmanager
def timing_capture(graph: torch.cuda.CUDAGraph) -> Iterator[None]:
    """A capture for timing a candidate: as `graph_capture`, but without `torch.cuda.graph`'s device synchronize and
    emptying of the allocator's cache at every capture (a build's tactics capture hundreds of times)."""
    current = torch.cuda.current_stream()
    stream = torch.cuda.Stream()
    stream.wait_stream(current)
    with ONE_CAPTURE, torch.cuda.stream(stream):
        graph.capture_begin(capture_error_mode="thread_local")
        try:
            yield
        finally:
            graph.capture_end()
    current.wait_stream(stream)
