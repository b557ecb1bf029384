"""Load generated Triton source as a module: Triton's JIT reads a kernel's source from its file, so the source is
written once into a cache folder under a name that is its hash, imported by path, and memoized per process.

The folder is `$TORCHKILN_CACHE_DIR/kernels` (default `~/.cache/torchkiln/kernels`). A file there is only a copy
of source this process generated: one whose text differs is rewritten before it is imported.
"""
from __future__ import annotations

import hashlib
import importlib.util
import os
import pathlib
import tempfile
from types import ModuleType

from torchkiln.runtime.backends.cuda.cache import cache_dir

_LOADED: dict[tuple[str, str], ModuleType] = {}


def kernel_dir() -> pathlib.Path:
    """Where generated kernel sources are written."""
    return cache_dir() / "kernels"


def load_source(source: str) -> ModuleType:
    """The module `source` defines, imported from its file in `kernel_dir()`; once per source (and Triton
    interpreter setting, which decides what `triton.jit` returns) in a process."""
    digest = hashlib.sha256(source.encode()).hexdigest()[:40]
    key = (digest, os.environ.get("TRITON_INTERPRET", ""))
    module = _LOADED.get(key)
    if module is not None:
        return module
    folder = kernel_dir()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"tk_{digest}.py"
    if not path.is_file() or path.read_text() != source:
        fd, tmp = tempfile.mkstemp(dir=folder, suffix=".tmp")  # whole file or none: another process may read it
        with os.fdopen(fd, "w") as f:
            f.write(source)
        os.replace(tmp, path)
    spec = importlib.util.spec_from_file_location(f"torchkiln_kernels.tk_{digest}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    _LOADED[key] = module
    return module
