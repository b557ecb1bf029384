"""Generated kernels compiled in worker processes.

Triton's compiler holds the interpreter lock for part of its work, so threads of one process compile at most about
2.6 times as fast as one (16 kernels, H200 host); processes compile side by side. A worker compiles a kernel for the
arguments the launching process would give it (Triton's serialized specialization, as `JITFunction.preload` takes
it) into Triton's on-disk cache; the launching process then compiles it itself, which finds that cache's copy and
only loads it. A kernel a worker could not compile is compiled by the launching process as before, so a worker
never changes what a launch does or which error it raises.

Workers are started as `python -P compile_worker.py`, not with multiprocessing, whose spawn would run the user's
script again in each one. They import Triton alone (not torch), touch no GPU, and also build the launcher Triton
makes for each kernel signature with the C compiler (about 0.3 s each, once per cache folder). They start in the
background (`warm`, at the start of a compile, while the frontend works) and are kept until the process exits.
Until one is ready, threads of this process compile.
"""
from __future__ import annotations

import atexit
import contextlib
import contextvars
import logging
import os
import pathlib
import subprocess
import sys
import threading
from typing import Any

from torchkiln.runtime.backends.cuda.codegen.compile_worker import MODULE_PREFIX, read_frame, write_frame

logger = logging.getLogger(__name__)

PROCESSES_ENV = "TORCHKILN_COMPILE_PROCESSES"
MAX_PROCESSES = 8
_SCRIPT = pathlib.Path(__file__).with_name("compile_worker.py")
_CAPTURING: contextvars.ContextVar[list | None] = contextvars.ContextVar("torchkiln_capturing", default=None)
_POOL_LOCK = threading.Lock()
_POOL: _Pool | None = None


def compile_processes() -> int:
    """Compile workers a process keeps: `$TORCHKILN_COMPILE_PROCESSES` (0: none), else half the CPUs this process
    may run on, at most `MAX_PROCESSES`; none with fewer than 4 CPUs."""
    given = os.environ.get(PROCESSES_ENV, "").strip()
    if given.isdigit():
        return int(given)
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return 0 if cpus < 4 else min(MAX_PROCESSES, cpus // 2)


class Worker:
    """One compile worker process: `compile` sends it a request and waits for the reply (one at a time)."""

    def __init__(self) -> None:
        self.process = subprocess.Popen([sys.executable, "-P", str(_SCRIPT)], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, env=dict(os.environ))
        self.ready = threading.Event()
        self.broken = False
        self.lock = threading.Lock()
        threading.Thread(target=self._await_ready, name="torchkiln-compile-worker-start", daemon=True).start()

    def _await_ready(self) -> None:
        try:
            self.broken = read_frame(self.process.stdout) != "ready"
        except Exception:  # noqa: BLE001  (a worker that cannot start is only not used)
            self.broken = True
        if self.broken:
            logger.debug("a compile worker did not start (exit status %s)", self.process.poll())
        self.ready.set()

    def usable(self) -> bool:
        return self.ready.is_set() and not self.broken

    def compile(self, request: tuple) -> str | None:
        """The worker's reply to `request` (None: compiled); raises OSError where the worker is gone."""
        with self.lock:
            try:
                write_frame(self.process.stdin, request)
                reply = read_frame(self.process.stdout)
            except (OSError, EOFError, ValueError) as e:
                self.broken = True
                raise OSError(f"compile worker {self.process.pid} is gone") from e
            if reply is None and self.process.poll() is not None:
                self.broken = True
                raise OSError(f"compile worker {self.process.pid} exited ({self.process.returncode})")
            return reply

    def close(self) -> None:
        with contextlib.suppress(OSError, ValueError):
            self.process.stdin.close()
        try:
            self.process.wait(timeout=2)
        except subprocess.TimeoutExpired:
            self.process.kill()


class _Pool:
    def __init__(self, size: int) -> None:
        self.pid = os.getpid()
        self.workers = [Worker() for _ in range(size)]

    def close(self) -> None:
        for worker in self.workers:
            worker.close()


def workers() -> list[Worker]:
    """This process's compile workers, started on first use (`compile_processes` of them); none where that is 0,
    without a GPU, or where Triton interprets kernels. A process forked from one that had workers starts its own:
    the pipes are its parent's."""
    global _POOL
    import torch

    if os.environ.get("TRITON_INTERPRET", "") not in ("", "0") or not torch.cuda.is_available():
        return []
    with _POOL_LOCK:
        if _POOL is None or _POOL.pid != os.getpid():
            size = compile_processes()
            if size <= 0:
                return []
            _POOL = _Pool(size)
            atexit.register(_POOL.close)
            logger.debug("started %d compile workers", size)
        return _POOL.workers


def warm() -> None:
    """Start the compile workers now (`workers`); they get ready in the background."""
    workers()


def specialization(kernel: Any, grid: tuple[int, ...], args: tuple, meta: dict[str, Any]) -> str | None:
    """Triton's serialized specialization of `kernel` for a launch with these arguments, found without compiling
    it; None where this process has compiled it already."""
    from triton import knobs

    _install_hook(knobs)
    found: list[str] = []
    token = _CAPTURING.set(found)
    try:
        kernel.run(*args, grid=grid, warmup=True, **meta)
    finally:
        _CAPTURING.reset(token)
    return found[0] if found else None


def request(kernel: Any, specialization: str, target: tuple) -> tuple | None:
    """A worker's request to compile `kernel` for `specialization` and the GPU `target` (`compile_worker.py`); None
    for a kernel whose source is not a generated file (a worker loads no other module)."""
    from triton import knobs

    fn = getattr(kernel, "fn", None)
    module, path = getattr(fn, "__module__", ""), getattr(getattr(fn, "__code__", None), "co_filename", "")
    if not module.startswith(MODULE_PREFIX) or not os.path.isfile(path):
        return None
    return path, module, fn.__name__, specialization, knobs.cache.dir, target


def current_target() -> tuple:
    """The current device's Triton target, as a request carries it."""
    from triton.runtime.driver import driver

    target = driver.active.get_current_target()
    return target.backend, target.arch, target.warp_size


_HOOKED: list = []  # the hook installed, and the one it found there


def _install_hook(knobs: Any) -> None:
    """Triton's pre-compile hook, wrapped once: inside `specialization` it keeps the specialization and skips the
    compile; elsewhere it is the hook it found."""
    with _POOL_LOCK:
        if _HOOKED and knobs.runtime.jit_cache_hook is _HOOKED[0]:
            return
        previous = knobs.runtime.jit_cache_hook

        def hook(**kwargs: Any) -> Any:
            found = _CAPTURING.get()
            if found is None:
                return previous(**kwargs) if previous is not None else None
            found.append(kwargs["compile"]["specialization_data"])
            return True

        knobs.runtime.jit_cache_hook = hook
        _HOOKED[:] = [hook, previous]
