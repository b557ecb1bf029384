"""Where the CUDA backend keeps what it generates and measures: `$TORCHKILN_CACHE_DIR` (default
`~/.cache/torchkiln`), with `kernels/` (generated Triton sources) and `timing.json` (tactic choices)."""
from __future__ import annotations

import os
import pathlib

CACHE_ENV = "TORCHKILN_CACHE_DIR"


def cache_dir() -> pathlib.Path:
    return pathlib.Path(os.environ.get(CACHE_ENV) or pathlib.Path.home() / ".cache" / "torchkiln")
