"""Normalization converters: batch norm (inference) as a per-channel scale."""
from __future__ import annotations

import torch

from torchkiln.conversion.context import ConversionCtx
from torchkiln.conversion.impl.common import needs_static
from torchkiln.conversion.registry import converter
from torchkiln.conversion.resolve import Args
from torchkiln.network import layers as L
from torchkiln.network.tensor import Tensor


def _batch_norm_ok(args: Args) -> str | None:
    if args.training and (args.running_mean is None or args.running_var is None):
        return "batch norm with batch statistics (training=True and no running stats)"
    return needs_static(args, "weight", "bias", "running_mean", "running_var")


@converter("aten::batch_norm", capability=_batch_norm_ok)
def batch_norm(ctx: ConversionCtx, args: Args) -> Tensor:
    x = ctx.to_tensor(args.input)
    channels = x.shape[1]
    mean = args.running_mean.double()
    var = args.running_var.double()
    weight = args.weight.double() if args.weight is not None else torch.ones(channels, dtype=torch.float64)
    bias = args.bias.double() if args.bias is not None else torch.zeros(channels, dtype=torch.float64)
    scale = weight / torch.sqrt(var + args.eps)
    shift = bias - mean * scale
    dtype = x.dtype if x.dtype.is_floating_point else torch.float32
    return ctx.network.add_scale(x, L.ScaleMode.CHANNEL, scale=scale.to(dtype), shift=shift.to(dtype)).get_output()
