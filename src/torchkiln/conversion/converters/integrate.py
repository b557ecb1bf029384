"""Trapezoid-rule converters: trapezoid/trapz and cumulative_trapezoid, with spacing x (a tensor) or dx (a number),
in ATen's order of operations."""
from __future__ import annotations

from torchkiln.analysis.registry import converter
from torchkiln.analysis.resolve import Args
from torchkiln.conversion.context import ConversionCtx
from torchkiln.conversion.impl.common import normalize_dim
from torchkiln.conversion.impl.elementwise import binary
from torchkiln.conversion.impl.reduce import reduce
from torchkiln.conversion.impl.shuffle import reshape
from torchkiln.conversion.impl.slicing import select, slice_dim
from torchkiln.ir import layers as L
from torchkiln.ir.tensor import Tensor

E = L.ElementWiseOperation


def _trapezoid_ok(args: Args) -> str | None:
    y = args.y
    if not y.dtype.is_floating_point:
        return f"a {y.dtype} tensor (only floating ones converted)"
    dim = normalize_dim(args.dim, len(y.shape)) if y.shape else None
    if dim is None or not isinstance(y.shape[dim], int) or y.shape[dim] < 2:
        return "fewer than 2 samples along dim (eager gives zeros)"
    x = args.get("x")
    if x is not None and (x.dtype != y.dtype or len(x.shape) not in (1, len(y.shape))):
        return f"spacing x of dtype {x.dtype} and rank {len(x.shape)} (only 1-d or y's rank, y's dtype)"
    return None


def _sides(ctx: ConversionCtx, y: Tensor, dim: int) -> Tensor:
    """left + right: the neighbouring samples summed."""
    return binary(ctx, slice_dim(ctx, y, dim, 0, -1), slice_dim(ctx, y, dim, 1, None), E.SUM)


def _dx(ctx: ConversionCtx, x: Tensor, dim: int, rank: int) -> Tensor:
    if x.rank == 1 and rank > 1:  # viewed along dim
        x = reshape(ctx, x, [x.shape[0] if d == dim else 1 for d in range(rank)])
    return binary(ctx, slice_dim(ctx, x, dim, 1, None), slice_dim(ctx, x, dim, 0, -1), E.SUB)


@converter("aten::trapezoid.x", "aten::trapz.x", "aten::trapezoid.dx", "aten::trapz.dx", capability=_trapezoid_ok)
def trapezoid(ctx: ConversionCtx, args: Args) -> Tensor:
    """x: sum((left + right) * dx) / 2; dx: (sum(y) - (first + last) / 2) * dx."""
    y = ctx.to_tensor(args.y)
    dim = normalize_dim(args.dim, y.rank)
    if args.get("x") is not None:
        weighted = binary(ctx, _sides(ctx, y, dim), _dx(ctx, ctx.to_tensor(args.x), dim, y.rank), E.PROD)
        return binary(ctx, reduce(ctx, weighted, L.ReduceOperation.SUM, dim, False), 2.0, E.DIV)
    ends = binary(ctx, binary(ctx, select(ctx, y, dim, 0), select(ctx, y, dim, -1), E.SUM), 0.5, E.PROD)
    return binary(ctx, binary(ctx, reduce(ctx, y, L.ReduceOperation.SUM, dim, False), ends, E.SUB), args.dx, E.PROD)


@converter("aten::cumulative_trapezoid.x", "aten::cumulative_trapezoid.dx", capability=_trapezoid_ok)
def cumulative_trapezoid(ctx: ConversionCtx, args: Args) -> Tensor:
    """x: cumsum((left + right) * dx) / 2; dx: cumsum(dx / 2 * (left + right))."""
    y = ctx.to_tensor(args.y)
    dim = normalize_dim(args.dim, y.rank)
    if args.get("x") is not None:
        weighted = binary(ctx, _sides(ctx, y, dim), _dx(ctx, ctx.to_tensor(args.x), dim, y.rank), E.PROD)
        total = ctx.network.add_cumulative(weighted, L.CumulativeOperation.SUM, dim).get_output()
        return binary(ctx, total, 2.0, E.DIV)
    weighted = binary(ctx, args.dx / 2.0, _sides(ctx, y, dim), E.PROD)
    return ctx.network.add_cumulative(weighted, L.CumulativeOperation.SUM, dim).get_output()
