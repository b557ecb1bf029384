"""Reduction converters: mean, sum, prod, amax/amin, max/min over all, all/any, logsumexp, cumsum/cumprod,
vector and matrix norms, var/std."""
from __future__ import annotations

import math
from typing import Any

import torch

from torchkiln.conversion.context import ConversionCtx
from torchkiln.conversion.impl.common import normalize_dim, normalize_dims, to_dtype
from torchkiln.conversion.impl.elementwise import binary, unary
from torchkiln.conversion.impl.reduce import matrix_norm, reduce, variance, vector_norm
from torchkiln.conversion.impl.shuffle import squeeze_dims
from torchkiln.analysis.registry import converter
from torchkiln.analysis.resolve import Args
from torchkiln.ir import layers as L
from torchkiln.ir.tensor import Tensor

R, E, U = L.ReduceOperation, L.ElementWiseOperation, L.UnaryOperation


@converter("aten::mean", "aten::mean.dim")
def mean(ctx: ConversionCtx, args: Args) -> Tensor:
    return reduce(ctx, args.self, R.AVG, args.get("dim"), args.get("keepdim", False), to_dtype(args.dtype))


@converter("aten::sum", "aten::sum.dim_IntList")
def sum_(ctx: ConversionCtx, args: Args) -> Tensor:
    return reduce(ctx, args.self, R.SUM, args.get("dim"), args.get("keepdim", False), to_dtype(args.dtype))


@converter("aten::prod", "aten::prod.dim_int")
def prod(ctx: ConversionCtx, args: Args) -> Tensor:
    return reduce(ctx, args.self, R.PROD, args.get("dim"), args.get("keepdim", False), to_dtype(args.dtype))


@converter("aten::amax", "aten::max")
def amax(ctx: ConversionCtx, args: Args) -> Tensor:
    return reduce(ctx, args.self, R.MAX, args.get("dim"), args.get("keepdim", False))


@converter("aten::amin", "aten::min")
def amin(ctx: ConversionCtx, args: Args) -> Tensor:
    return reduce(ctx, args.self, R.MIN, args.get("dim"), args.get("keepdim", False))


def _logical(ctx: ConversionCtx, args: Args, op: L.ReduceOperation) -> Tensor:
    x = ctx.to_tensor(args.self)
    if args.get("dim") == []:  # all.dims/any.dims over no dims: the truth of each element
        truth = binary(ctx, x, 0, E.NOT_EQUAL)
        return ctx.to_tensor(truth, torch.uint8) if x.dtype == torch.uint8 else truth
    return reduce(ctx, x, op, args.get("dim"), args.get("keepdim", False))


@converter("aten::all", "aten::all.dim", "aten::all.dims")
def all_(ctx: ConversionCtx, args: Args) -> Tensor:
    return _logical(ctx, args, R.ALL)


@converter("aten::any", "aten::any.dim", "aten::any.dims")
def any_(ctx: ConversionCtx, args: Args) -> Tensor:
    return _logical(ctx, args, R.ANY)


@converter("aten::logsumexp")
def logsumexp(ctx: ConversionCtx, args: Args) -> Tensor:
    """max + log(sum(exp(x - max))), with an infinite max replaced by 0 as torch does."""
    x = ctx.to_tensor(args.self)
    dims = normalize_dims(args.dim, x.rank)
    peak = reduce(ctx, x, R.MAX, dims, True)
    infinite = unary(ctx, peak, U.ISINF)
    zero = ctx.to_tensor(0.0, peak.dtype)
    safe = ctx.network.add_select(infinite, zero, peak).get_output()
    total = reduce(ctx, unary(ctx, binary(ctx, x, safe, E.SUB), U.EXP), R.SUM, dims, args.keepdim)
    if not args.keepdim:
        safe = squeeze_dims(ctx, safe, dims)
    return binary(ctx, unary(ctx, total, U.LOG), safe, E.SUM)


def _cumulative(ctx: ConversionCtx, args: Args, op: L.CumulativeOperation) -> Tensor:
    x = ctx.to_tensor(args.self, to_dtype(args.dtype))
    return ctx.network.add_cumulative(x, op, normalize_dim(args.dim, x.rank)).get_output()


@converter("aten::cumsum")
def cumsum(ctx: ConversionCtx, args: Args) -> Tensor:
    return _cumulative(ctx, args, L.CumulativeOperation.SUM)


@converter("aten::cumprod")
def cumprod(ctx: ConversionCtx, args: Args) -> Tensor:
    return _cumulative(ctx, args, L.CumulativeOperation.PROD)


# ---- norms ------------------------------------------------------------------------------------

@converter("aten::norm.Scalar", "aten::norm.ScalarOpt_dim", "aten::norm.ScalarOpt_dim_dtype",
           "aten::norm.ScalarOpt_dtype")
def norm(ctx: ConversionCtx, args: Args) -> Tensor:
    p = 2 if args.p is None else args.p
    return vector_norm(ctx, ctx.to_tensor(args.self, to_dtype(args.get("dtype"))), p, args.get("dim"),
                       args.get("keepdim", False))


@converter("aten::frobenius_norm.dim")
def frobenius_norm(ctx: ConversionCtx, args: Args) -> Tensor:
    return vector_norm(ctx, ctx.to_tensor(args.self), 2, args.dim, args.keepdim)


@converter("aten::linalg_vector_norm")
def linalg_vector_norm(ctx: ConversionCtx, args: Args) -> Tensor:
    return vector_norm(ctx, ctx.to_tensor(args.self, to_dtype(args.dtype)), args.ord, args.dim, args.keepdim)


_MATRIX_ORDS = ("fro", 1, -1, math.inf, -math.inf)


def _linalg_norm_plan(args: Args) -> tuple[str, Any, list[int] | None]:
    """What torch.linalg.norm computes for these arguments: ('vector' | 'matrix', ord, dims)."""
    ord, dim = args.ord, args.dim
    dims = [dim] if isinstance(dim, int) else None if dim is None else list(dim)
    if ord is None:
        return ("matrix", "fro", dims) if dims is not None and len(dims) == 2 else ("vector", 2, dims)
    if dims is None:  # torch takes a 1-d input as a vector and a 2-d input as a matrix
        dims = list(range(len(args.self.shape)))
    return ("vector" if len(dims) == 1 else "matrix"), ord, dims


def _linalg_norm_ok(args: Args) -> str | None:
    kind, ord, dims = _linalg_norm_plan(args)
    if kind == "matrix" and ord not in _MATRIX_ORDS:
        return f"matrix norm of order {ord!r} (needs singular values)"
    if kind == "matrix" and len(dims) != 2:
        return f"matrix norm over {len(dims)} dims"
    return None


@converter("aten::linalg_norm", "aten::linalg_norm.ord_str", capability=_linalg_norm_ok)
def linalg_norm(ctx: ConversionCtx, args: Args) -> Tensor:
    kind, ord, dims = _linalg_norm_plan(args)
    x = ctx.to_tensor(args.self, to_dtype(args.dtype))
    if kind == "vector":
        return vector_norm(ctx, x, ord, dims, args.keepdim)
    return matrix_norm(ctx, x, ord, dims, args.keepdim)


# ---- variance ---------------------------------------------------------------------------------

def _correction(args: Args) -> float:
    if "correction" in args.names:
        return 1 if args.correction is None else args.correction
    return 1 if args.unbiased else 0


@converter("aten::var", "aten::var.dim", "aten::var.correction")
def var(ctx: ConversionCtx, args: Args) -> Tensor:
    return variance(ctx, ctx.to_tensor(args.self), args.get("dim"), _correction(args), args.get("keepdim", False))


@converter("aten::std", "aten::std.dim", "aten::std.correction")
def std(ctx: ConversionCtx, args: Args) -> Tensor:
    return unary(ctx, var(ctx, args), U.SQRT)
