"""Pooling converters."""
from __future__ import annotations

from torchkiln.conversion.context import ConversionCtx
from torchkiln.conversion.impl.pooling import adaptive_pool, pool
from torchkiln.analysis.registry import converter
from torchkiln.analysis.resolve import Args
from torchkiln.ir import layers as L
from torchkiln.ir.tensor import Tensor

_ND = {"1d": 1, "2d": 2, "3d": 3}


def _nd(args: Args) -> int:
    return _ND[args.node.kind().removesuffix("_with_indices")[-2:]]


def _indices_unused(args: Args) -> str | None:
    """Capability of pools that also return indices: only their values can be converted."""
    if args.node.outputsAt(1).uses():
        return "its indices output is used (the engine computes only the pooled values)"
    return None


@converter("aten::max_pool1d", "aten::max_pool2d", "aten::max_pool3d")
def max_pool(ctx: ConversionCtx, args: Args) -> Tensor:
    return pool(ctx, ctx.to_tensor(args.self), L.PoolingType.MAX, _nd(args), args.kernel_size, args.stride,
                args.padding, args.dilation, args.ceil_mode)


@converter("aten::max_pool1d_with_indices", "aten::max_pool2d_with_indices", "aten::max_pool3d_with_indices",
           capability=_indices_unused)
def max_pool_with_indices(ctx: ConversionCtx, args: Args) -> tuple[Tensor, None]:
    return max_pool(ctx, args), None


@converter("aten::avg_pool1d", "aten::avg_pool2d", "aten::avg_pool3d")
def avg_pool(ctx: ConversionCtx, args: Args) -> Tensor:
    divisor = args.get("divisor_override")
    pooled = pool(ctx, ctx.to_tensor(args.self), L.PoolingType.AVERAGE, _nd(args), args.kernel_size, args.stride,
                  args.padding, ceil_mode=args.ceil_mode, count_include_pad=args.count_include_pad,
                  divisor_override=abs(divisor) if divisor is not None else None)
    if divisor is not None and divisor < 0:  # torch divides by it as given: sum / -d is exactly -(sum / d)
        return ctx.network.add_unary(pooled, L.UnaryOperation.NEG).get_output()
    return pooled


@converter("aten::adaptive_avg_pool1d", "aten::adaptive_avg_pool2d", "aten::adaptive_avg_pool3d")
def adaptive_avg_pool(ctx: ConversionCtx, args: Args) -> Tensor:
    return adaptive_pool(ctx, ctx.to_tensor(args.self), L.PoolingType.AVERAGE, args.output_size)


@converter("aten::adaptive_max_pool1d", "aten::adaptive_max_pool2d", "aten::adaptive_max_pool3d",
           capability=_indices_unused)
def adaptive_max_pool(ctx: ConversionCtx, args: Args) -> tuple[Tensor, None]:
    return adaptive_pool(ctx, ctx.to_tensor(args.self), L.PoolingType.MAX, args.output_size), None
