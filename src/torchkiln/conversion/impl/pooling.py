"""Pooling: fixed windows, and adaptive pooling as windows, reductions or slices."""
from __future__ import annotations

from collections.abc import Sequence

from torchkiln.conversion.context import ConversionCtx
from torchkiln.conversion.impl.common import expand_param
from torchkiln.ir import layers as L
from torchkiln.ir.tensor import Tensor


def pool(ctx: ConversionCtx, x: Tensor, kind: L.PoolingType, nd: int, kernel, stride, padding,
         dilation=(1,), ceil_mode: bool = False, count_include_pad: bool = True,
         divisor_override: int | None = None) -> Tensor:
    window = expand_param(kernel, nd)
    stride = expand_param(stride, nd) if stride else window  # an empty stride means the window
    return ctx.network.add_pooling_nd(
        x, kind, window, stride=stride, padding=expand_param(padding, nd),
        dilation=expand_param(dilation, nd) if kind == L.PoolingType.MAX else (),
        ceil_mode=ceil_mode, count_include_pad=count_include_pad, divisor_override=divisor_override,
    ).get_output()


def adaptive_pool(ctx: ConversionCtx, x: Tensor, kind: L.PoolingType, output_size: Sequence[int | None]) -> Tensor:
    """Adaptive average/max pooling over the last len(output_size) dims, exactly as torch bins them."""
    nd = len(output_size)
    spatial = x.shape[-nd:]
    out = [s if o is None else o for s, o in zip(spatial, output_size)]
    reduce_op = L.ReduceOperation.AVG if kind == L.PoolingType.AVERAGE else L.ReduceOperation.MAX
    if all(o == 1 for o in out):
        axes = list(range(x.rank - nd, x.rank))
        return ctx.network.add_reduce(x, reduce_op, axes, keep_dims=True).get_output()
    if all(s % o == 0 for s, o in zip(spatial, out)):
        window = [s // o for s, o in zip(spatial, out)]
        return ctx.network.add_pooling_nd(x, kind, window, stride=window, padding=[0] * nd).get_output()
    # Bins of unequal size: pool one dim at a time (the bins are a product of intervals).
    for k in range(nd):
        axis = x.rank - nd + k
        size, bins = spatial[k], out[k]
        pieces = []
        for i in range(bins):
            start, end = (i * size) // bins, -((-(i + 1) * size) // bins)
            starts = [0] * x.rank
            starts[axis] = start
            shape = list(x.shape)
            shape[axis] = end - start
            piece = ctx.network.add_slice(x, starts, shape, [1] * x.rank).get_output()
            pieces.append(ctx.network.add_reduce(piece, reduce_op, [axis], keep_dims=True).get_output())
        x = ctx.network.add_concatenation(pieces, axis).get_output()
    return x
