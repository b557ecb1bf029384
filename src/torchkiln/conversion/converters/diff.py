"""aten::diff: n-th forward difference along a dim, with optional prepended and appended values."""
from __future__ import annotations

import torch

from torchkiln.conversion.context import ConversionCtx
from torchkiln.conversion.impl.common import normalize_dim
from torchkiln.conversion.impl.elementwise import binary
from torchkiln.conversion.impl.slicing import slice_dim
from torchkiln.analysis.registry import converter
from torchkiln.analysis.resolve import Args
from torchkiln.ir import layers as L
from torchkiln.ir.tensor import Tensor


@converter("aten::diff")
def diff(ctx: ConversionCtx, args: Args) -> Tensor:
    x = ctx.to_tensor(args.self)
    dim = normalize_dim(args.dim, x.rank)
    if args.n == 0:  # torch returns the input itself: prepend and append are not added
        return x
    parts = [ctx.to_tensor(t) for t in (args.prepend, x, args.append) if t is not None]
    if len(parts) > 1:
        x = ctx.network.add_concatenation(parts, dim).get_output()
    op = L.ElementWiseOperation.XOR if x.dtype == torch.bool else L.ElementWiseOperation.SUB
    for _ in range(args.n):
        x = binary(ctx, slice_dim(ctx, x, dim, 1, None), slice_dim(ctx, x, dim, 0, x.shape[dim] - 1), op)
    return x
