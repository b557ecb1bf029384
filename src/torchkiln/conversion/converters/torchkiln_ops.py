"""Converters of torchkiln's own ops (`torchkiln.ops`)."""
from __future__ import annotations

import torch

from torchkiln import ops as _ops  # noqa: F401  (defines the ops)
from torchkiln.conversion.context import ConversionCtx
from torchkiln.analysis.registry import converter
from torchkiln.analysis.resolve import Args
from torchkiln.ir.tensor import Tensor


@converter("torchkiln::const")
def const(ctx: ConversionCtx, args: Args) -> Tensor:
    """A constant when the value is known at build time; otherwise the tensor itself."""
    return ctx.to_tensor(args.self)


@converter("torchkiln::attn_bias_from_attn_mask")
def attn_bias_from_attn_mask(ctx: ConversionCtx, args: Args) -> Tensor:
    mask = ctx.to_tensor(args.attn_mask)
    if mask.dtype != torch.bool:
        return mask
    zero, minus_inf = ctx.to_tensor(torch.tensor(0.0)), ctx.to_tensor(torch.tensor(float("-inf")))
    return ctx.network.add_select(mask, zero, minus_inf).get_output()
