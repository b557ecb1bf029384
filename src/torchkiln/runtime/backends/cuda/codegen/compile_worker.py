"""A compile worker: a process that compiles generated Triton kernels into Triton's on-disk cache for the process
that started it (`compile_workers.py`). It is run as a script (`python -P compile_worker.py`) and imports Triton
only: not torch (so it starts in well under a second), not torchkiln. It touches no GPU.

Requests and replies are frames: a 4-byte little-endian length, then a pickle. The worker reads requests on its
stdin and writes replies on what was its stdout; anything else written to stdout goes to stderr. The first reply
says the worker is ready. A request is `(path, module, kernel, specialization, cache_dir, target)`: the kernel
`kernel` of the generated source file `path`, loaded under the module name `module` (the name the launching process
gave it, which Triton's specialization names), compiled for `specialization` (Triton's serialized one, as
`JITFunction.preload` takes it) and the GPU target `target` (backend, architecture, warp size) into the cache folder
`cache_dir`, with the launcher Triton builds for its signature on a CUDA target. Its reply is None, or the error's
text.
"""
import importlib.util
import os
import pickle
import struct
import sys

MODULE_PREFIX = "torchkiln_kernels."  # the only modules a worker loads: generated sources (codegen/compile.py)


def read_frame(stream):
    """The next frame's object; None at the end of the stream."""
    head = stream.read(4)
    if len(head) < 4:
        return None
    size = struct.unpack("<I", head)[0]
    body = stream.read(size)
    if len(body) < size:
        return None
    return pickle.loads(body)


def write_frame(stream, obj) -> None:
    body = pickle.dumps(obj)
    stream.write(struct.pack("<I", len(body)) + body)
    stream.flush()


def _load(path: str, module: str, loaded: dict):
    found = loaded.get((path, module))
    if found is None:
        if not module.startswith(MODULE_PREFIX):
            raise ValueError(f"module {module!r} is not a generated kernel source")
        spec = importlib.util.spec_from_file_location(module, path)
        found = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(found)
        loaded[(path, module)] = found
    return found


class _Target:
    """The worker's active Triton driver: the launching process's GPU target, and no device."""

    def __init__(self, target) -> None:
        self.target = target

    def get_current_device(self) -> int:
        return 0

    def get_current_target(self):
        return self.target


def _compile(request, loaded: dict) -> None:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.runtime.driver import driver

    path, module, kernel, specialization, cache_dir, target = request
    if cache_dir:
        triton.knobs.cache.dir = cache_dir
    target = GPUTarget(*target)
    driver.set_active(_Target(target))
    compiled = getattr(_load(path, module, loaded), kernel).preload(specialization)
    if target.backend == "cuda":
        from triton.backends.nvidia.driver import CudaLauncher

        try:  # built with the C compiler into the cache, not loaded; where it fails, the launching process builds it
            CudaLauncher(compiled.src, compiled.metadata)
        except Exception:  # noqa: BLE001
            pass


def main() -> None:
    replies = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # what the compiler prints goes to stderr, not into the replies
    requests = sys.stdin.buffer
    import triton.compiler  # noqa: F401  (imported now, not at the first request)

    write_frame(replies, "ready")
    loaded: dict = {}
    while (request := read_frame(requests)) is not None:
        try:
            _compile(request, loaded)
            write_frame(replies, None)
        except Exception as e:  # the launching process compiles the kernel itself, and raises its own error
            write_frame(replies, f"{type(e).__name__}: {e}")


if __name__ == "__main__":
    main()
