"""Layer, group and instance normalization composed of reductions and elementwise layers.

The network's NormalizationLayer would be the one-layer form, but `Network.add_normalization` cannot add
it today (its `kind=` parameter collides with `add_layer`'s own `kind`); `normalize` is the one place to
switch over once it can.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch

from torchkiln.conversion.context import ConversionCtx
from torchkiln.conversion.impl.elementwise import binary, unary
from torchkiln.conversion.impl.reduce import reduce
from torchkiln.conversion.impl.shuffle import reshape
from torchkiln.network import layers as L
from torchkiln.network.tensor import Tensor

R, E = L.ReduceOperation, L.ElementWiseOperation


def normalize(ctx: ConversionCtx, x: Tensor, axes: Sequence[int], eps: float) -> Tensor:
    """(x - mean) / sqrt(biased variance + eps) over `axes`."""
    centered = binary(ctx, x, reduce(ctx, x, R.AVG, axes, True), E.SUB)
    variance = reduce(ctx, unary(ctx, centered, L.UnaryOperation.SQUARE), R.AVG, axes, True)
    return binary(ctx, centered, unary(ctx, binary(ctx, variance, eps, E.SUM), L.UnaryOperation.RSQRT), E.PROD)


def affine(ctx: ConversionCtx, x: Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None,
           per_channel: bool) -> Tensor:
    """x * weight + bias, the weights either per channel (dim 1) or broadcast against x's trailing dims."""
    if weight is None and bias is None:
        return x
    mode = L.ScaleMode.CHANNEL if per_channel else L.ScaleMode.ELEMENTWISE
    cast = {k: None if w is None else w.to(x.dtype) for k, w in (("scale", weight), ("shift", bias))}
    return ctx.network.add_scale(x, mode, **cast).get_output()


def group_normalize(ctx: ConversionCtx, x: Tensor, groups: int, eps: float) -> Tensor:
    """Normalize each of `groups` channel groups of each sample over its channels and spatial dims."""
    grouped = reshape(ctx, x, [x.shape[0], groups, -1])
    return reshape(ctx, normalize(ctx, grouped, [2], eps), x.shape)
