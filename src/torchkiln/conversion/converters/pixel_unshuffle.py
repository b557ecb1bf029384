"""pixel_unshuffle, the inverse of pixel_shuffle: (*, C, H*r, W*r) -> (*, C*r*r, H, W) as reshape, transpose,
reshape."""
from __future__ import annotations

from torchkiln.conversion.context import ConversionCtx
from torchkiln.conversion.impl.shuffle import permute, reshape
from torchkiln.analysis.registry import converter
from torchkiln.analysis.resolve import Args
from torchkiln.ir.tensor import Tensor


@converter("aten::pixel_unshuffle")
def pixel_unshuffle(ctx: ConversionCtx, args: Args) -> Tensor:
    x, r = ctx.to_tensor(args.self), args.downscale_factor
    *lead, channels, h, w = x.shape
    b = len(lead)
    split = reshape(ctx, x, [*lead, channels, h // r, r, w // r, r])
    moved = permute(ctx, split, [*range(b), b, b + 2, b + 4, b + 1, b + 3])
    return reshape(ctx, moved, [*lead, channels * r * r, h // r, w // r])
