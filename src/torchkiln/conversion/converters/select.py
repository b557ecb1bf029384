"""Selection converters: where (tensor or scalar branches) and masked_fill (and in place)."""
from __future__ import annotations

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
