"""Slices along one dim: Python slice semantics, selection, and splits into pieces."""
from __future__ import annotations

from collections.abc import Sequence

import torch

from torchkiln.conversion.context import ConversionCtx
from torchkiln.conversion.impl.common import normalize_dim
from torchkiln.conversion.impl.shuffle import reshape
from torchkiln.errors import ConversionError
from torchkiln.ir.symbolic import Dim, as_dim, decide, floordiv, has_symbols, is_symbolic
from torchkiln.ir.tensor import Tensor


def slice_dim(ctx: ConversionCtx, x: Tensor, dim: int, start: int | None, end: int | None, step: int = 1) -> Tensor:
    """x[..., start:end:step, ...] on `dim`, with Python's clamping of negative and out-of-range bounds."""
    if step <= 0:
        raise ConversionError(f"slice step must be positive, got {step}")
    dim = normalize_dim(dim, x.rank)
    if has_symbols([start, end, x.shape[dim]]):
        first, count = _symbolic_slice(x.shape[dim], start, end, step)
        if step == 1 and decide("eq", count, x.shape[dim]):
            return x
    else:
        first, stop, step = slice(start, end, step).indices(x.shape[dim])
        count = len(range(first, stop, step))
    if count == x.shape[dim] and step == 1:
        return x
    starts, shape, strides = [0] * x.rank, list(x.shape), [1] * x.rank
    starts[dim], shape[dim], strides[dim] = first if count else 0, count, step
    return ctx.network.add_slice(x, starts, shape, strides).get_output()


def _known(op: str, a: Dim, b: Dim, what: str) -> bool:
    result = decide(op, a, b)
    if result is None:
        raise ConversionError(f"needs a static shape: whether {a} {op} {b} ({what}) depends on the input shapes")
    return result


def _clamp(bound: Dim, size: Dim, what: str) -> Dim:
    """Python's slice clamping of one bound (negative counts from the end) where the shapes settle it."""
    if not _known("ge", bound, 0, what):
        bound = as_dim(bound + size)
        if not _known("ge", bound, 0, what):
            return 0
    return bound if _known("le", bound, size, what) else size


def _symbolic_slice(size: Dim, start: Dim | None, end: Dim | None, step: int) -> tuple[Dim, Dim]:
    """(first index, element count) of x[start:end:step] on a dim of symbolic size or with symbolic bounds."""
    first = 0 if start is None else _clamp(start, size, "slice start")
    stop = size if end is None else _clamp(end, size, "slice end")
    span = as_dim(stop - first)
    if not _known("ge", span, 0, "slice length"):
        return first, 0
    return first, floordiv(span + step - 1, step)


def select(ctx: ConversionCtx, x: Tensor, dim: int, index: int) -> Tensor:
    """x.select(dim, index): one index along `dim` (negative counts from the end), the dim removed."""
    dim = normalize_dim(dim, x.rank)
    if not -x.shape[dim] <= index < x.shape[dim]:
        raise ConversionError(f"index {index} is out of range for dim {dim} of size {x.shape[dim]}")
    index %= x.shape[dim]
    piece = slice_dim(ctx, x, dim, index, index + 1)
    return reshape(ctx, piece, x.shape[:dim] + x.shape[dim + 1:])


def split_as(ctx: ConversionCtx, x: Tensor, dim: int, pieces: Sequence[torch.Tensor | torch.Size]) -> list[Tensor]:
    """Consecutive slices of `x` along `dim` with the sizes (along dim) of `pieces`, in order."""
    dim = normalize_dim(dim, x.rank)
    out, offset = [], 0
    for piece in pieces:
        size = piece.shape[dim] if isinstance(piece, torch.Tensor) else piece[dim]
        out.append(slice_dim(ctx, x, dim, offset, offset + size))
        offset += size
    return out


def meta_of(x: Tensor, dim: int) -> torch.Tensor:
    """An empty meta tensor shaped like `x` along `dim`: run torch's own rules for pieces along that dim (chunk,
    split...) on it. Dynamic dims other than `dim` do not matter to them and are 1 here."""
    dim = normalize_dim(dim, x.rank)
    if is_symbolic(x.shape[dim]):
        raise ConversionError(f"needs a static shape: pieces along dim {dim} of dynamic size {x.shape[dim]}")
    return torch.empty([1 if is_symbolic(d) else d for d in x.shape], dtype=x.dtype, device="meta")
