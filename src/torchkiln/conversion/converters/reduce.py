"""Reduction converters: mean, sum, logsumexp."""
from __future__ import annotations

from torchkiln.conversion.context import ConversionCtx
from torchkiln.conversion.impl.common import normalize_dims
from torchkiln.conversion.impl.elementwise import binary, unary
from torchkiln.conversion.impl.reduce import reduce
from torchkiln.conversion.impl.shuffle import squeeze_dims
from torchkiln.conversion.registry import converter
from torchkiln.conversion.resolve import Args
from torchkiln.network import layers as L
from torchkiln.network.tensor import Tensor

R, E, U = L.ReduceOperation, L.ElementWiseOperation, L.UnaryOperation


@converter("aten::mean", "aten::mean.dim")
def mean(ctx: ConversionCtx, args: Args) -> Tensor:
    return reduce(ctx, args.self, R.AVG, args.get("dim"), args.get("keepdim", False), args.dtype)


@converter("aten::sum", "aten::sum.dim_IntList")
def sum_(ctx: ConversionCtx, args: Args) -> Tensor:
    return reduce(ctx, args.self, R.SUM, args.get("dim"), args.get("keepdim", False), args.dtype)


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
