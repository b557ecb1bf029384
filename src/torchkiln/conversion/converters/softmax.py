"""Softmax converters."""
from __future__ import annotations

from torchkiln.conversion.context import ConversionCtx
from torchkiln.conversion.impl.common import normalize_dim
from torchkiln.conversion.registry import converter
from torchkiln.conversion.resolve import Args
from torchkiln.network.tensor import Tensor


@converter("aten::softmax.int")
def softmax(ctx: ConversionCtx, args: Args) -> Tensor:
    x = ctx.to_tensor(args.self, args.dtype)
    return ctx.network.add_softmax(x, normalize_dim(args.dim, x.rank)).get_output()
