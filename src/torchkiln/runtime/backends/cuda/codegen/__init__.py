"""Triton source generated from layers (never stored in an engine: regenerated when an engine loads)."""
from __future__ import annotations

import functools
import importlib.util


@functools.cache
def have_triton() -> bool:
    """Whether Triton is installed (without it, the planner keeps every layer on ATen and the libraries)."""
    return importlib.util.find_spec("triton") is not None
