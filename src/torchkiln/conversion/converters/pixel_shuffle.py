"""Pixel shuffle: (*, C*r*r, H, W) -> (*, C, H*r, W*r) as reshape, transpose, reshape; channel shuffle likewise."""
from __future__ import annotations

from torchkiln.conversion.context import ConversionCtx
from torchkiln.conversion.impl.shuffle import permute, reshape
from torchkiln.analysis.registry import converter
from torchkiln.analysis.resolve import Args
from torchkiln.ir.tensor import Tensor


@converter("aten::pixel_shuffle")
def pixel_shuffle(ctx: ConversionCtx, args: Args) -> Tensor:
    x, r = ctx.to_tensor(args.self), args.upscale_factor
    *batch, channels, height, width = x.shape
    n = len(batch)
    split = ctx.network.add_shuffle(
        x, reshape_dims=[*batch, channels // (r * r), r, r, height, width], zero_is_placeholder=False,
        second_transpose=[*range(n + 1), n + 3, n + 1, n + 4, n + 2]).get_output()
    return reshape(ctx, split, [*batch, channels // (r * r), height * r, width * r])


@converter("aten::channel_shuffle", "aten::native_channel_shuffle")
def channel_shuffle(ctx: ConversionCtx, args: Args) -> Tensor:
    """(N, g * k, *) -> (N, k, g, *) transposed -> (N, g * k, *)."""
    x, groups = ctx.to_tensor(args.self), args.groups
    n, channels, *rest = x.shape
    split = reshape(ctx, x, [n, groups, channels // groups, *rest])
    swapped = permute(ctx, split, [0, 2, 1, *range(3, x.rank + 1)])
    return reshape(ctx, swapped, list(x.shape))
