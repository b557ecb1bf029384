"""Selection converters: where (tensor or scalar branches), masked_fill (and in place), and tril / triu as a
constant mask made from the static shape."""
from __future__ import annotations

import torch

from torchkiln.conversion.context import ConversionCtx
from torchkiln.conversion.impl.elementwise import select
from torchkiln.conversion.impl.inplace import register_inplace
from torchkiln.analysis.registry import converter
from torchkiln.analysis.resolve import Args
from torchkiln.ir.tensor import Tensor


@converter("aten::where.self", "aten::where.ScalarSelf", "aten::where.ScalarOther", "aten::where.Scalar")
def where(ctx: ConversionCtx, args: Args) -> Tensor:
    return select(ctx, args.condition, args.self, args.other)


@converter("aten::masked_fill.Scalar", "aten::masked_fill.Tensor")
def masked_fill(ctx: ConversionCtx, args: Args) -> Tensor:
    """where(mask, value, self); the value takes self's dtype."""
    x = ctx.to_tensor(args.self)
    return select(ctx, args.mask, ctx.to_tensor(args.value, x.dtype), x)


register_inplace(masked_fill, "aten::masked_fill_.Scalar", "aten::masked_fill_.Tensor")


def _static_matrix(args: Args) -> str | None:
    shape = args.self.shape
    if len(shape) < 2:
        return "the tensor has fewer than 2 dims (eager raises)"
    if not all(isinstance(d, int) for d in shape[-2:]):
        return f"the mask needs static sizes of the last two dims, not {tuple(shape[-2:])}"
    return None


def _triangle(upper: bool):
    """tril / triu: self where the column minus the row is <= diagonal (tril) or >= diagonal (triu), else 0."""
    def convert(ctx: ConversionCtx, args: Args) -> Tensor:
        x = ctx.to_tensor(args.self)
        rows, cols = x.shape[-2:]
        offset = torch.arange(cols).view(1, cols) - torch.arange(rows).view(rows, 1)
        mask = offset >= args.diagonal if upper else offset <= args.diagonal
        return select(ctx, ctx.to_tensor(mask), x, ctx.to_tensor(torch.zeros((), dtype=x.dtype)))

    return convert


converter("aten::tril", capability=_static_matrix)(_triangle(upper=False))
converter("aten::triu", capability=_static_matrix)(_triangle(upper=True))
