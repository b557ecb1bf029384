"""Reductions over dims (mean, sum, max, ...), with torch's dim and dtype conventions, and the reductions
composed of them: vector norms, variance, and max/min with their indices."""
from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from torchkiln.conversion.context import ConversionCtx
from torchkiln.conversion.impl.common import normalize_dim, normalize_dims
from torchkiln.conversion.impl.elementwise import binary, unary
from torchkiln.conversion.impl.shuffle import reshape, squeeze_dims
from torchkiln.ir import layers as L
from torchkiln.ir.tensor import Tensor

R, E, U = L.ReduceOperation, L.ElementWiseOperation, L.UnaryOperation


def reduce(ctx: ConversionCtx, x, op: L.ReduceOperation, dims: Sequence[int] | int | None, keepdim: bool,
           dtype: torch.dtype | None = None) -> Tensor:
    """Reduce `x` over `dims` (None or [] = all); a 0-d input reduces to itself."""
    x = ctx.to_tensor(x, dtype)
    if x.rank == 0:
        return ctx.network.add_reduce(reshape(ctx, x, [1]), op, [0], keep_dims=False).get_output()
    return ctx.network.add_reduce(x, op, normalize_dims(dims, x.rank), keep_dims=keepdim).get_output()


def reduced_count(x: Tensor, dims: Sequence[int] | int | None) -> int:
    """How many elements each output of a reduction over `dims` (None or [] = all) combines."""
    return math.prod(x.shape[d] for d in normalize_dims(dims, x.rank)) if x.rank else 1


def vector_norm(ctx: ConversionCtx, x: Tensor, ord: float, dims: Sequence[int] | int | None, keepdim: bool
                ) -> Tensor:
    """torch.linalg.vector_norm composed exactly: sum(|x|^p)^(1/p), with torch's special orders."""
    if ord == 2:
        return unary(ctx, reduce(ctx, unary(ctx, x, U.SQUARE), R.SUM, dims, keepdim), U.SQRT)
    if ord == 0:
        nonzero = ctx.network.add_cast(binary(ctx, x, 0, E.NOT_EQUAL), x.dtype).get_output()
        return reduce(ctx, nonzero, R.SUM, dims, keepdim)
    magnitude = unary(ctx, x, U.ABS)
    if math.isinf(ord):
        return reduce(ctx, magnitude, R.MAX if ord > 0 else R.MIN, dims, keepdim)
    if ord == 1:
        return reduce(ctx, magnitude, R.SUM, dims, keepdim)
    total = reduce(ctx, binary(ctx, magnitude, float(ord), E.POW), R.SUM, dims, keepdim)
    return binary(ctx, total, 1.0 / ord, E.POW)


def matrix_norm(ctx: ConversionCtx, x: Tensor, ord: float | str, dims: Sequence[int], keepdim: bool) -> Tensor:
    """torch.linalg.matrix_norm for the orders that need no singular values: 'fro', ±1 and ±inf."""
    rows, cols = (normalize_dim(d, x.rank) for d in dims)
    if ord == "fro":
        return vector_norm(ctx, x, 2, [rows, cols], keepdim)
    summed, extreme = (rows, cols) if abs(ord) == 1 else (cols, rows)  # ±1: column sums; ±inf: row sums
    sums = reduce(ctx, unary(ctx, x, U.ABS), R.SUM, summed, True)
    out = reduce(ctx, sums, R.MAX if ord > 0 else R.MIN, extreme, True)
    return out if keepdim else squeeze_dims(ctx, out, [rows, cols])


def variance(ctx: ConversionCtx, x: Tensor, dims: Sequence[int] | int | None, correction: float, keepdim: bool
             ) -> Tensor:
    """sum((x - mean)^2) / max(N - correction, 0), as torch.var computes it (inf/nan when N <= correction)."""
    centered = binary(ctx, x, reduce(ctx, x, R.AVG, dims, True), E.SUB)
    total = reduce(ctx, unary(ctx, centered, U.SQUARE), R.SUM, dims, keepdim)
    return binary(ctx, total, float(max(reduced_count(x, dims) - correction, 0)), E.DIV)


def top_one(ctx: ConversionCtx, x: Tensor, op: L.TopKOperation, dim: int | None, keepdim: bool
            ) -> tuple[Tensor, Tensor]:
    """Values and int64 indices of the max or min along `dim` (None: over the flattened input), first
    occurrence on ties, like torch.max(x, dim) and torch.argmax."""
    if dim is None:
        flat = reshape(ctx, x, [-1])
        out_shape = [1] * x.rank if keepdim else []
        axis = 0
    else:
        axis = normalize_dim(dim, x.rank)
        flat = x if x.rank else reshape(ctx, x, [1])
        out_shape = [1 if i == axis else d for i, d in enumerate(x.shape) if keepdim or i != axis]
    layer = ctx.network.add_topk(flat, op, 1, axis)
    values, indices = layer.get_output(0), layer.get_output(1)
    if list(values.shape) == out_shape:
        return values, indices
    return reshape(ctx, values, out_shape), reshape(ctx, indices, out_shape)


def pairwise_distance(ctx: ConversionCtx, a, b, p: float, eps: float, keepdim: bool) -> Tensor:
    """torch.pairwise_distance: the p-norm of a - b + eps over the last dim of the wider operand."""
    rank = max(len(a.shape), len(b.shape))
    return vector_norm(ctx, binary(ctx, binary(ctx, a, b, E.SUB), eps, E.SUM), p, max(rank - 1, 0), keepdim)
