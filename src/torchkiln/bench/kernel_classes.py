"""Where a model's GPU time goes, by kernel class (`bench ... --profile`): library calls (cuBLAS, cuDNN, SDPA's
kernels), kernels torchkiln generated (Triton), ATen's own kernels, copies (memcpy, memset, layout copies) and idle
time (the wall time of a call that no kernel covers: launches, the host's work between them)."""
from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from torchkiln.runtime.backends.cuda.codegen import (depthwise, gemm, indexed, layout, pointwise, pooling,
                                                     quantized_conv, reduction)

CLASSES = ("library", "generated", "aten", "copies", "idle")
_ROWS = (reduction.KERNEL, reduction.LOOPED, reduction.SPLIT_STATS, reduction.SPLIT_APPLY)
GENERATED = (pointwise.KERNEL_NAME, *_ROWS, *(name + reduction.TRANSPOSED for name in _ROWS),
             reduction.SPLIT_APPLY + reduction.TRANSPOSED + reduction.SUB_ROWS, reduction.SPLIT_MERGE,
             gemm.KERNEL_NAME, quantized_conv.KERNEL_NAME,
             pooling.KERNEL_NAME, depthwise.KERNEL_NAME, indexed.KERNEL_NAME, layout.KERNEL_NAME)  # every kernel
# function the generators name


def classify_kernel(name: str) -> str:
    """The class of a CUDA kernel by its name (one of CLASSES but "idle")."""
    if name.startswith(("Memcpy", "Memset")) or "copy_kernel" in name:
        return "copies"
    if name.split("(")[0].strip() in GENERATED:
        return "generated"
    if "at::native" in name or name.startswith("void at::"):
        return "aten"
    return "library"


def by_class(kernels: Iterable[dict[str, Any]], iters: int, wall_ms: float) -> dict[str, float]:
    """Milliseconds per call of each class, from profile rows ({"name", "total_ms"} over `iters` calls) and the
    measured wall time of one call; "idle" is what the kernels leave of the wall time (0 where they overlap it)."""
    out = {c: 0.0 for c in CLASSES}
    for row in kernels:
        out[classify_kernel(row["name"])] += row["total_ms"] / iters
    out["idle"] = max(wall_ms - sum(out.values()), 0.0)
    return out


def launches(kernels: Iterable[dict[str, Any]], iters: int) -> float:
    """Kernel launches per call (memcpy and memset nodes included), from profile rows ({"calls"}) over `iters`
    calls."""
    return sum(row["calls"] for row in kernels) / iters


def format_classes(classes: dict[str, float]) -> str:
    """One line: each class's ms per call and share of the wall time."""
    wall = sum(classes.values()) or 1.0
    return "  ".join(f"{c} {classes[c]:.3f} ms ({100 * classes[c] / wall:.0f}%)" for c in CLASSES)
