"""Reduction converters: mean, sum, prod, amax/amin, max/min over all, all/any, logsumexp, cumsum/cumprod,
vector and matrix norms, var/std, nansum/nanmean, count_nonzero, aminmax, dist,
pairwise_distance, cosine_similarity, vecdot/vdot, sum_to_size, renorm.

var_mean and std_mean are not converted: their mean is Welford's, which gives NaN or inf for a row holding an
infinity depending on where it sits."""
from __future__ import annotations

import math
from typing import Any

import torch

from torchkiln.conversion.context import ConversionCtx
from torchkiln.conversion.impl.activation import clip
from torchkiln.conversion.impl.common import normalize_dim, normalize_dims, one_dtype, to_dtype
from torchkiln.conversion.impl.elementwise import binary, unary
from torchkiln.conversion.impl.reduce import matrix_norm, reduce, variance, vector_norm
from torchkiln.conversion.impl.reduce import pairwise_distance as pairwise_distance_of
from torchkiln.conversion.impl.shuffle import squeeze_dims
from torchkiln.conversion.impl.tiling import expand
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
    """The layer's integer results are int64; a narrower `dtype` asked for is their cast (the same wrapped values as
    torch accumulating in that dtype: sums and products modulo 2**bits)."""
    dtype = to_dtype(args.dtype)
    x = ctx.to_tensor(args.self, dtype)
    return ctx.to_tensor(ctx.network.add_cumulative(x, op, normalize_dim(args.dim, x.rank)).get_output(), dtype)


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


# ---- NaN-ignoring and counting reductions -----------------------------------------------------

def _floating(args: Args) -> str | None:
    return None if args.self.dtype.is_floating_point else f"a {args.self.dtype} tensor (only floating ones converted)"


@converter("aten::aminmax")
def aminmax(ctx: ConversionCtx, args: Args) -> tuple[Tensor, Tensor]:
    return amin(ctx, args), amax(ctx, args)


def _without_nan(ctx: ConversionCtx, x: Tensor) -> Tensor:
    return ctx.network.add_select(unary(ctx, x, U.ISNAN), ctx.to_tensor(0.0, x.dtype), x).get_output()


@converter("aten::nansum", capability=_floating)
def nansum(ctx: ConversionCtx, args: Args) -> Tensor:
    """sum with NaN counted as 0."""
    x = ctx.to_tensor(args.self, to_dtype(args.dtype))
    return reduce(ctx, _without_nan(ctx, x), R.SUM, args.dim, args.keepdim)


@converter("aten::nanmean", capability=_floating)
def nanmean(ctx: ConversionCtx, args: Args) -> Tensor:
    """nansum / the count of non-NaN elements (as ATen composes it: NaN where every element is NaN)."""
    x = ctx.to_tensor(args.self, to_dtype(args.dtype))
    count = reduce(ctx, ctx.to_tensor(unary(ctx, unary(ctx, x, U.ISNAN), U.NOT), torch.int64), R.SUM, args.dim,
                   args.keepdim)
    return binary(ctx, reduce(ctx, _without_nan(ctx, x), R.SUM, args.dim, args.keepdim), count, E.DIV)


@converter("aten::count_nonzero", "aten::count_nonzero.dim_IntList")
def count_nonzero(ctx: ConversionCtx, args: Args) -> Tensor:
    nonzero = ctx.to_tensor(binary(ctx, args.self, 0, E.NOT_EQUAL), torch.int64)
    return reduce(ctx, nonzero, R.SUM, args.dim, False)


# ---- distances and products -------------------------------------------------------------------

@converter("aten::dist", capability=one_dtype("self", "other", floating=True))
def dist(ctx: ConversionCtx, args: Args) -> Tensor:
    """The p-norm of self - other over every element."""
    return vector_norm(ctx, binary(ctx, args.self, args.other, E.SUB), args.p, None, False)


@converter("aten::pairwise_distance", capability=one_dtype("x1", "x2", floating=True))
def pairwise_distance(ctx: ConversionCtx, args: Args) -> Tensor:
    return pairwise_distance_of(ctx, args.x1, args.x2, args.p, args.eps, args.keepdim)


@converter("aten::linalg_vecdot", capability=one_dtype("x", "y", floating=True))
def linalg_vecdot(ctx: ConversionCtx, args: Args) -> Tensor:
    """sum(x * y) over `dim` (of real tensors, no conjugate)."""
    return reduce(ctx, binary(ctx, args.x, args.y, E.PROD), R.SUM, args.dim, False)


@converter("aten::vdot", capability=one_dtype("self", "other", floating=True))
def vdot(ctx: ConversionCtx, args: Args) -> Tensor:
    return reduce(ctx, binary(ctx, args.self, args.other, E.PROD), R.SUM, None, False)


def _matrix_norm_ok(args: Args) -> str | None:
    return None if args.ord in _MATRIX_ORDS else f"matrix norm of order {args.ord!r} (needs singular values)"


@converter("aten::linalg_matrix_norm", "aten::linalg_matrix_norm.str_ord", capability=_matrix_norm_ok)
def linalg_matrix_norm(ctx: ConversionCtx, args: Args) -> Tensor:
    return matrix_norm(ctx, ctx.to_tensor(args.self, to_dtype(args.dtype)), args.ord, args.dim, args.keepdim)


@converter("aten::sum_to_size")
def sum_to_size(ctx: ConversionCtx, args: Args) -> Tensor:
    """Summed over the leading dims `size` lacks and (keeping them) over the dims where it has 1."""
    x, size = ctx.to_tensor(args.self), list(args.size)
    lead = x.rank - len(size)
    ones = [lead + i for i, s in enumerate(size) if s == 1 and x.shape[lead + i] != 1]
    out = reduce(ctx, x, R.SUM, ones, True) if ones else x
    return reduce(ctx, out, R.SUM, list(range(lead)), False) if lead else out


@converter("aten::renorm", capability=one_dtype("self", floating=True))
def renorm(ctx: ConversionCtx, args: Args) -> Tensor:
    """Each slice along `dim` scaled by maxnorm / (norm + 1e-7) where its p-norm exceeds maxnorm, as ATen does."""
    x = ctx.to_tensor(args.self)
    dim = normalize_dim(args.dim, x.rank)
    norm = vector_norm(ctx, x, args.p, [d for d in range(x.rank) if d != dim], True)
    scale = binary(ctx, args.maxnorm, binary(ctx, norm, 1e-7, E.SUM), E.DIV)
    factor = ctx.network.add_select(binary(ctx, norm, args.maxnorm, E.GREATER), scale,
                                    ctx.to_tensor(1.0, x.dtype)).get_output()
    return binary(ctx, x, factor, E.PROD)


@converter("aten::cosine_similarity", capability=one_dtype("x1", "x2", floating=True))
def cosine_similarity(ctx: ConversionCtx, args: Args) -> Tensor:
    """sum((x1 / max(|x1|, eps)) * (x2 / max(|x2|, eps))) over `dim`, each divided by its norm first, as ATen does."""
    x1, x2 = ctx.to_tensor(args.x1), ctx.to_tensor(args.x2)
    shape = list(torch.broadcast_shapes(x1.shape, x2.shape))
    x1, x2 = expand(ctx, x1, shape), expand(ctx, x2, shape)
    dim = normalize_dim(args.dim, len(shape))

    def unit(x: Tensor) -> Tensor:
        norm = vector_norm(ctx, x, 2, dim, True)
        return binary(ctx, x, clip(ctx, norm, args.eps, None), E.DIV)

    return reduce(ctx, binary(ctx, unit(x1), unit(x2), E.PROD), R.SUM, dim, False)
