"""Triton source generated from layers (never stored in an engine: regenerated when an engine loads)."""
from __future__ import annotations

import concurrent.futures
import contextlib
import contextvars
import functools
import importlib.util
import logging
import os
import threading
from collections.abc import Iterator
from typing import Any

logger = logging.getLogger(__name__)

# A kernel launched right after another generated kernel on its stream is launched programmatically dependent on it
# (PDL, Hopper and later): it is scheduled as the kernel before it finishes, and its first act is to wait for that
# kernel's writes (`WAIT_LINES`). In a CUDA graph this hides most of the launch between two kernels: a chain of add +
# layer-norm kernels over [1,128,768] fp16 took 1.27 us a kernel against 1.81 (H100). After a library kernel it does
# not pay (1 row kernel + 1 cuBLAS GEMM: 5.56 against 5.40 us), so only generated kernels are chained, to generated
# kernels. A kernel reads and writes nothing before its wait, so the chaining never changes what it computes.
CHAIN_CAPABILITY = (9, 0)
PDL_PARAM = "PDL: tl.constexpr = False"  # every generated kernel's last parameter...
WAIT_LINES = ("if PDL:", "    gdc_wait()")  # ... and the first lines of its body
_CHAINED = contextvars.ContextVar("torchkiln_chained", default=False)
_CAPTURED_LATER = contextvars.ContextVar("torchkiln_captured_later", default=False)
_AHEAD: contextvars.ContextVar[_Ahead | None] = contextvars.ContextVar("torchkiln_ahead", default=None)
COMPILE_THREADS_ENV = "TORCHKILN_COMPILE_THREADS"
MAX_COMPILE_THREADS = 32


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


@functools.cache
def chains(device: object) -> bool:
    """Whether generated kernels on `device` can be launched chained (`chained`)."""
    import torch

    device = torch.device(device)
    return device.type == "cuda" and torch.cuda.get_device_capability(device) >= CHAIN_CAPABILITY


@contextlib.contextmanager
def chained(on: bool) -> Iterator[None]:
    """Generated kernels launched in this block follow another generated kernel on their stream (where `on`)."""
    token = _CHAINED.set(on)
    try:
        yield
    finally:
        _CHAINED.reset(token)


@contextlib.contextmanager
def captured_later() -> Iterator[None]:
    """Runs in this block are recorded for a runtime that captures their launches as a CUDA graph itself (a tape, for
    the C++ runtime: runtime/tape.py), though they run uncaptured here (`chains_steps`)."""
    token = _CAPTURED_LATER.set(True)
    try:
        yield
    finally:
        _CAPTURED_LATER.reset(token)


def launches_recorded() -> bool:
    """Whether launches here are recorded for a runtime that replays them itself (`captured_later`): its tape carries
    pointers and scalars, so a kernel that can take either is given pointers."""
    return _CAPTURED_LATER.get()


def chains_steps(device: object, captured: bool) -> bool:
    """Whether a runner on `device` launches a generated step that follows another generated step chained to it
    (`chained`): on a GPU that chains, where its launches are captured as a CUDA graph (`captured`: its own graph)
    or recorded for one (`captured_later`). Uncaptured runs stay unchained: chaining was measured to pay in graphs."""
    return (captured or _CAPTURED_LATER.get()) and chains(device)


def chain_options() -> dict[str, bool]:
    """The launch options of a generated kernel: a programmatic dependent launch inside `chained(True)`, else none
    (the kernel's `PDL` stays False and it waits for nothing)."""
    return {"PDL": True, "launch_pdl": True} if _CHAINED.get() else {}


def needs_int64(*tensors) -> bool:
    """Whether an element offset of any of `tensors` (over its strides) or its element count reaches 2**31, so a
    generated kernel must index in int64 (int32 indexing is cheaper)."""
    limit = 1 << 31
    for t in tensors:
        if t.numel() >= limit or sum((n - 1) * abs(s) for n, s in zip(t.shape, t.stride()) if n) >= limit:
            return True
    return False


def compile_threads() -> int:
    """Threads that compile generated kernels side by side: `$TORCHKILN_COMPILE_THREADS`, else the CPUs this process
    may run on (at most 32). Triton's compiler holds the interpreter lock for part of its work: 16 distinct
    pointwise kernels compiled 2.6 times as fast on 4 threads as on one, and no faster on 16 (H200 host)."""
    given = os.environ.get(COMPILE_THREADS_ENV, "")
    if given.strip().isdigit() and int(given) > 0:
        return int(given)
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, min(MAX_COMPILE_THREADS, cpus))


def launch(kernel: Any, grid: tuple[int, ...], *args: Any, **meta: Any) -> None:
    """Launch a generated Triton kernel: `kernel[grid](*args, **meta)`. Inside `compiling_ahead`, its compile for these
    arguments is queued instead, and nothing runs."""
    ahead = _AHEAD.get()
    if ahead is None:
        kernel[grid](*args, **meta)
    else:
        ahead.submit(kernel, grid, args, meta)


def is_compiling_ahead() -> bool:
    """Whether this thread is inside `compiling_ahead` (its launches run nothing)."""
    return _AHEAD.get() is not None


class _Pointer:
    """What Triton specializes a tensor argument on, its dtype and address, without holding the tensor's memory (the
    convention of Triton's own `MockTensor`, which `warmup` takes in place of a tensor)."""

    def __init__(self, tensor: Any) -> None:
        self.dtype = tensor.dtype
        self._address = tensor.data_ptr()

    def data_ptr(self) -> int:
        return self._address


class _Ahead:
    """The compiles queued by launches inside `compiling_ahead`, on a thread pool, each once."""

    def __init__(self, pool: concurrent.futures.ThreadPoolExecutor) -> None:
        import torch

        self.pool = pool
        # Triton keeps a kernel's compiles per current device: the worker compiles for the launching thread's one
        self.device = torch.cuda.current_device() if torch.cuda.is_available() else None
        self.futures: dict[tuple, concurrent.futures.Future] = {}
        self.lock = threading.Lock()
        self.loading: dict[int, threading.Lock] = {}  # id of a compiled kernel -> the lock of its loading

    def submit(self, kernel: Any, grid: tuple[int, ...], args: tuple, meta: dict[str, Any]) -> None:
        args = tuple(_Pointer(a) if hasattr(a, "data_ptr") and hasattr(a, "dtype") else a for a in args)
        # A block repeated at one shape launches the same kernels with the same arguments: compiled once. The key
        # tells apart at least what Triton's specialization does (it takes integers only as 1, multiples of 16 or
        # neither, and a pointer as aligned to 16 bytes or not).
        key = (id(kernel), tuple(_specialized(a) for a in args), tuple((k, _specialized(v)) for k, v in meta.items()))
        if key in self.futures:
            return
        caches = getattr(kernel, "device_caches", None)  # made on first use, which two threads would each do
        if caches is not None and self.device is not None:
            caches[self.device]
        self.futures[key] = self.pool.submit(self._compile, kernel, grid, args, meta)

    def _compile(self, kernel: Any, grid: tuple[int, ...], args: tuple, meta: dict[str, Any]) -> None:
        import torch

        with torch.cuda.device(self.device) if self.device is not None else contextlib.nullcontext():
            self._load(kernel.run(*args, grid=grid, warmup=True, **meta))

    def _load(self, compiled: Any) -> None:
        """Load a compiled kernel onto the device and make its launcher, as its first launch would: Triton builds a
        launcher for each kernel signature with the C compiler (about 0.3 s, once per signature and cache folder), in
        a subprocess, so threads do it side by side. Two threads never load one kernel at once."""
        init = getattr(compiled, "_init_handles", None)
        if init is None:
            return
        with self.lock:
            lock = self.loading.setdefault(id(compiled), threading.Lock())
        with lock:
            init()


def _specialized(value: Any) -> Any:
    """A launch argument as the compile-once key of `_Ahead.submit` takes it."""
    if isinstance(value, _Pointer):
        return "pointer", str(value.dtype), value.data_ptr() % 16 == 0
    if value is None or isinstance(value, (bool, int, float, str)):
        return type(value).__name__, value
    return "object", id(value)


@contextlib.contextmanager
def compiling_ahead() -> Iterator[_Ahead]:
    """Generated kernels launched inside run nothing: each one's compile for its arguments is queued (once) on a pool
    of `compile_threads()`, and leaving waits for them all. A dry run of a plan's first call in here compiles its
    kernels side by side, where the call itself compiles them one by one as it reaches them. A compile that fails
    is left for the real launch to fail again, with its own error. Yields the queue (`futures`: one a compile)."""
    with concurrent.futures.ThreadPoolExecutor(compile_threads(), thread_name_prefix="torchkiln-compile") as pool:
        ahead = _Ahead(pool)
        token = _AHEAD.set(ahead)
        try:
            yield ahead
        finally:
            _AHEAD.reset(token)
            failed = sum(f.exception() is not None for f in ahead.futures.values())
            if failed:
                logger.debug("%d of %d kernels compiled ahead failed (their launches raise)", failed,
                             len(ahead.futures))
