"""Where the C++ runtime library is: libtorchkiln_runtime.so registers torchkiln's TorchScript ops in C++, so that a
program with no Python runs compiled modules (csrc/, docs/deployment.md)."""
from __future__ import annotations

import os
import pathlib

LIBRARY = "libtorchkiln_runtime.so"
LIBRARY_ENV = "TORCHKILN_RUNTIME_LIBRARY"
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
