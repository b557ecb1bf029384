"""Reductions over dims (mean, sum, max, ...), with torch's dim and dtype conventions."""
from __future__ import annotations

from collections.abc import Sequence

import torch

from torchkiln.conversion.context import ConversionCtx
from torchkiln.conversion.impl.common import normalize_dims
from torchkiln.conversion.impl.shuffle import reshape
from torchkiln.network import layers as L
from torchkiln.network.tensor import Tensor


def reduce(ctx: ConversionCtx, x, op: L.ReduceOperation, dims: Sequence[int] | int | None, keepdim: bool,
           dtype: torch.dtype | None = None) -> Tensor:
    """Reduce `x` over `dims` (None or [] = all); a 0-d input reduces to itself."""
    x = ctx.to_tensor(x, dtype)
    if x.rank == 0:
        return ctx.network.add_reduce(reshape(ctx, x, [1]), op, [0], keep_dims=False).get_output()
    return ctx.network.add_reduce(x, op, normalize_dims(dims, x.rank), keep_dims=keepdim).get_output()
