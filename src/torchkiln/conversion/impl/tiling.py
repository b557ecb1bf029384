"""Broadcasting and tiling by reshape + expand: repeat, repeat_interleave, meshgrid."""
from __future__ import annotations

import math
from collections.abc import Sequence

from torchkiln.conversion.context import ConversionCtx
from torchkiln.conversion.impl.shuffle import reshape
from torchkiln.ir.tensor import Tensor


def expand(ctx: ConversionCtx, x: Tensor, shape: Sequence[int]) -> Tensor:
    """torch.Tensor.expand: size-1 dims broadcast, new leading dims added, -1 keeps a dim."""
    shape = list(shape)
    offset = len(shape) - x.rank
    full = [x.shape[i - offset] if d == -1 else d for i, d in enumerate(shape)]
    if tuple(full) == x.shape:
        return x
    return ctx.network.add_expand(x, full).get_output()


def repeat(ctx: ConversionCtx, x: Tensor, repeats: Sequence[int]) -> Tensor:
    """torch.Tensor.repeat: tile x `repeats[i]` times along dim i (leading repeats add dims)."""
    repeats = list(repeats)
    shape = [1] * (len(repeats) - x.rank) + list(x.shape)
    interleaved = [d for size in shape for d in (1, size)]
    tiled = [d for r, size in zip(repeats, shape) for d in (r, size)]
    spread = expand(ctx, reshape(ctx, x, interleaved), tiled)
    return reshape(ctx, spread, [r * size for r, size in zip(repeats, shape)])


def repeat_each(ctx: ConversionCtx, x: Tensor, dim: int, times: int) -> Tensor:
    """Each element repeated `times` times along `dim` in place (repeat_interleave with one count)."""
    shape = list(x.shape)
    spread = expand(ctx, reshape(ctx, x, shape[:dim + 1] + [1] + shape[dim + 1:]),
                    shape[:dim + 1] + [times] + shape[dim + 1:])
    return reshape(ctx, spread, shape[:dim] + [shape[dim] * times] + shape[dim + 1:])


def meshgrid(ctx: ConversionCtx, tensors: Sequence[Tensor], indexing: str) -> list[Tensor]:
    """torch.meshgrid of 0-d or 1-d tensors; 'xy' swaps the roles of the first two."""
    sizes = [math.prod(t.shape) for t in tensors]
    axes = list(range(len(tensors)))
    if indexing == "xy" and len(tensors) >= 2:
        axes[0], axes[1] = 1, 0
        sizes[0], sizes[1] = sizes[1], sizes[0]
    grids = []
    for t, axis in zip(tensors, axes):
        shape = [1] * len(tensors)
        shape[axis] = math.prod(t.shape)
        grids.append(expand(ctx, reshape(ctx, t, shape), sizes))
    return grids
