"""Where the C++ runtime library is: libtorchkiln_runtime.so registers torchkiln's TorchScript ops in C++, so that a
program with no Python runs compiled modules (csrc/, docs/deployment.md). Where it is built, a Python process loads it
too, and its kernel runs the engine calls that a recorded tape fits (`host_library`)."""
from __future__ import annotations

import contextlib
import logging
import os
import pathlib
from collections.abc import Iterator

import torch

logger = logging.getLogger(__name__)

LIBRARY = "libtorchkiln_runtime.so"
LIBRARY_ENV = "TORCHKILN_RUNTIME_LIBRARY"
NATIVE_ENV = "TORCHKILN_NATIVE_RUNTIME"  # "0": a Python process does not load the library
_PACKAGE = pathlib.Path(__file__).resolve().parent.parent
BUILD_STEPS = ("cmake -S csrc -B build/cpp -G Ninja -DCMAKE_PREFIX_PATH=\"$(python -c 'import torch;"
               "print(torch.utils.cmake_prefix_path)')\" && cmake --build build/cpp && "
               "cmake --install build/cpp --prefix src/torchkiln")


def runtime_library_path() -> str:
    """The path of libtorchkiln_runtime.so for a C++ program to link or LD_PRELOAD: $TORCHKILN_RUNTIME_LIBRARY, else
    the one installed into the package (torchkiln/lib/); FileNotFoundError saying how to build it otherwise."""
    candidates = [pathlib.Path(os.environ[LIBRARY_ENV])] if os.environ.get(LIBRARY_ENV) else []
    candidates.append(_PACKAGE / "lib" / LIBRARY)
    for path in candidates:
        if path.is_file():
            return str(path)
    raise FileNotFoundError(f"{LIBRARY} is not built (looked at {', '.join(map(str, candidates))}); build it from a "
                            f"source checkout with: {BUILD_STEPS} (docs/deployment.md), or set {LIBRARY_ENV}")


def _library_defines_ops() -> bool:
    return hasattr(torch.ops.torchkiln, "hold_tapes")


def host_library() -> bool:
    """Load the C++ runtime library into this process where it is built, unless $TORCHKILN_NATIVE_RUNTIME is 0 (or
    it was loaded already); True where its kernel is then torchkiln::execute_engine's. Called before the package
    defines its ops: the library's kernel runs the calls a tape fits and hands the others to the package's."""
    if os.environ.get(NATIVE_ENV, "") == "0":
        return False
    if not _library_defines_ops():
        try:
            path = runtime_library_path()
        except FileNotFoundError:
            return False
        stamp = pathlib.Path(path + ".torch")  # the torch release it was built against (csrc/CMakeLists.txt)
        built = stamp.read_text().strip() if stamp.is_file() else None
        if built is not None and built != torch.__version__.split("+")[0]:
            logger.warning("the C++ runtime library %s was built against torch %s, not this process's %s: engines "
                           "run on the Python runtime (rebuild the library)", path, built, torch.__version__)
            return False
        try:
            torch.ops.load_library(path)
        except (OSError, RuntimeError) as e:
            logger.warning("the C++ runtime library %s does not load in this process (%s): engines run on the "
                           "Python runtime", path, e)
            return False
        if not _library_defines_ops():
            logger.warning("the C++ runtime library %s registered no ops in this process (its message says why): "
                           "engines run on the Python runtime", path)
    return _library_defines_ops()


@contextlib.contextmanager
def tapes_held() -> Iterator[None]:
    """Within: every engine call runs on the package's runtime, none on a tape in the hosted library (a step profiler
    times the package's runner)."""
    if not _library_defines_ops():
        yield
        return
    torch.ops.torchkiln.hold_tapes(1)
    try:
        yield
    finally:
        torch.ops.torchkiln.hold_tapes(-1)
