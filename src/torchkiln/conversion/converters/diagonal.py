"""Diagonal converters: diagonal (and diagonal_copy, linalg.diagonal), diag, diag_embed, diagflat, trace,
diagonal_scatter.

A diagonal is a strided slice of the two dims flattened into one; an embedded diagonal is the input gathered along a
new dim and selected by a constant mask (zeros elsewhere, exact for NaN and infinities)."""
from __future__ import annotations

import torch

from torchkiln.analysis.registry import converter
from torchkiln.analysis.resolve import Args
from torchkiln.conversion.context import ConversionCtx
from torchkiln.conversion.impl.common import normalize_dim
from torchkiln.conversion.impl.elementwise import select
from torchkiln.conversion.impl.reduce import reduce
from torchkiln.conversion.impl.shuffle import permute, reshape, unsqueeze
from torchkiln.conversion.impl.slicing import slice_dim
from torchkiln.conversion.impl.tiling import expand
from torchkiln.ir import layers as L
from torchkiln.ir.tensor import Tensor


def _static(args: Args) -> str | None:
    return None if all(isinstance(d, int) for d in args[0].shape) else "a dim known only at run time"


def diagonal(ctx: ConversionCtx, x: Tensor, offset: int, dim1: int, dim2: int) -> Tensor:
    """torch.diagonal: the other dims in order, then the diagonal of (dim1, dim2) as the last dim."""
    d1, d2 = normalize_dim(dim1, x.rank), normalize_dim(dim2, x.rank)
    rest = [d for d in range(x.rank) if d not in (d1, d2)]
    rows, cols = x.shape[d1], x.shape[d2]
    count = max(0, min(rows, cols - offset) if offset >= 0 else min(rows + offset, cols))
    flat = reshape(ctx, permute(ctx, x, rest + [d1, d2]), [x.shape[d] for d in rest] + [rows * cols])
    start = offset if offset >= 0 else -offset * cols
    if count == 0:
        return slice_dim(ctx, flat, len(rest), 0, 0)
    return slice_dim(ctx, flat, len(rest), start, start + (count - 1) * (cols + 1) + 1, cols + 1)


def diag_embed(ctx: ConversionCtx, x: Tensor, offset: int, dim1: int, dim2: int) -> Tensor:
    """torch.diag_embed: x's last dim on the `offset` diagonal of two new dims (dim1, dim2 of the output)."""
    if x.rank == 0:
        x = reshape(ctx, x, [1])
    m, rank = x.shape[-1], x.rank + 1
    n = m + abs(offset)
    along = x.rank - 1
    # offset >= 0: row i holds x[i] at column i + offset; offset < 0: column j holds x[j] at row j - offset.
    index = ctx.to_tensor(torch.clamp(torch.arange(n), max=max(m - 1, 0)))
    gathered = ctx.network.add_gather(x, index, along, L.GatherMode.DEFAULT).get_output()
    spread = unsqueeze(ctx, gathered, rank - 1 if offset >= 0 else rank - 2)
    spread = expand(ctx, spread, list(x.shape[:-1]) + [n, n])
    i, j = torch.arange(n).unsqueeze(1), torch.arange(n).unsqueeze(0)
    mask = (j - i == offset) & ((i if offset >= 0 else j) < m)
    embedded = select(ctx, ctx.to_tensor(mask), spread, ctx.to_tensor(0, x.dtype))
    d1, d2 = normalize_dim(dim1, rank), normalize_dim(dim2, rank)
    rest = iter(range(rank - 2))
    return permute(ctx, embedded, [rank - 2 if p == d1 else rank - 1 if p == d2 else next(rest) for p in range(rank)])


@converter("aten::diagonal", "aten::diagonal_copy", capability=_static)
def diagonal_converter(ctx: ConversionCtx, args: Args) -> Tensor:
    return diagonal(ctx, ctx.to_tensor(args.self), args.offset, args.dim1, args.dim2)


@converter("aten::linalg_diagonal", capability=_static)
def linalg_diagonal(ctx: ConversionCtx, args: Args) -> Tensor:
    return diagonal(ctx, ctx.to_tensor(args.A), args.offset, args.dim1, args.dim2)


@converter("aten::diag_embed", capability=_static)
def diag_embed_converter(ctx: ConversionCtx, args: Args) -> Tensor:
    return diag_embed(ctx, ctx.to_tensor(args.self), args.offset, args.dim1, args.dim2)


@converter("aten::diag", capability=_static)
def diag(ctx: ConversionCtx, args: Args) -> Tensor:
    """Of a 1-d tensor, the square matrix with it on the `diagonal`; of a 2-d one, that diagonal."""
    x = ctx.to_tensor(args.self)
    if x.rank == 1:
        return diag_embed(ctx, x, args.diagonal, 0, 1)
    return diagonal(ctx, x, args.diagonal, 0, 1)


@converter("aten::diagflat", capability=_static)
def diagflat(ctx: ConversionCtx, args: Args) -> Tensor:
    return diag_embed(ctx, reshape(ctx, ctx.to_tensor(args.self), [-1]), args.offset, 0, 1)


def _floating_matrix(args: Args) -> str | None:
    if not args.self.dtype.is_floating_point:
        return f"a {args.self.dtype} tensor (its trace is int64: only floating ones converted)"
    return _static(args)


@converter("aten::trace", capability=_floating_matrix)
def trace(ctx: ConversionCtx, args: Args) -> Tensor:
    return reduce(ctx, diagonal(ctx, ctx.to_tensor(args.self), 0, 0, 1), L.ReduceOperation.SUM, None, False)


@converter("aten::diagonal_scatter", capability=_static)
def diagonal_scatter(ctx: ConversionCtx, args: Args) -> Tensor:
    """self with its (offset, dim1, dim2) diagonal replaced by src: src's last dim gathered onto the plane of dim1
    and dim2, selected by a constant mask."""
    x, src = ctx.to_tensor(args.self), ctx.to_tensor(args.src, args.self.dtype)
    d1, d2 = normalize_dim(args.dim1, x.rank), normalize_dim(args.dim2, x.rank)
    rows, cols, offset = x.shape[d1], x.shape[d2], args.offset
    length = src.shape[-1]
    if length == 0:
        return x
    i, j = torch.arange(rows).unsqueeze(1), torch.arange(cols).unsqueeze(0)
    along = (i if offset >= 0 else j).expand(rows, cols)
    index = ctx.to_tensor(torch.clamp(along, max=length - 1))
    plane = ctx.network.add_gather(src, index, src.rank - 1, L.GatherMode.DEFAULT).get_output()  # rest + (rows, cols)
    rest = [d for d in range(x.rank) if d not in (d1, d2)]
    order = rest + [d1, d2]
    plane = permute(ctx, plane, [order.index(d) for d in range(x.rank)])
    mask = j - i == offset  # (rows, cols): in x, dim1 and dim2 may come in the other order
    mask = (mask if d1 < d2 else mask.T).reshape([rows if d == d1 else cols if d == d2 else 1 for d in range(x.rank)])
    return select(ctx, ctx.to_tensor(mask), plane, x)
