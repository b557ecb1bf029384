"""Convolutions (1-3d, transposed) with constant weights."""
from __future__ import annotations

from collections.abc import Sequence

import torch

from torchkiln.conversion.context import ConversionCtx
from torchkiln.conversion.impl.common import expand_param
from torchkiln.conversion.impl.shuffle import reshape
from torchkiln.errors import ConversionError
from torchkiln.ir import layers as L
from torchkiln.ir.tensor import Tensor


def convolution(
    ctx: ConversionCtx,
    x: Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    stride: Sequence[int],
    padding: Sequence[int] | str,
    dilation: Sequence[int],
    groups: int,
    transposed: bool = False,
    output_padding: Sequence[int] = (0,),
) -> Tensor:
    """A convolution layer; string padding ('valid', 'same') as torch computes it; an unbatched input
    (no batch dim, as conv1d/2d/3d and conv_transpose accept) gets one for the layer."""
    nd = weight.dim() - 2
    if x.rank == nd + 1:
        out = convolution(ctx, reshape(ctx, x, (1, *x.shape)), weight, bias, stride, padding, dilation, groups,
                          transposed, output_padding)
        return reshape(ctx, out, out.shape[1:])
    stride, dilation = expand_param(stride, nd), expand_param(dilation, nd)
    if isinstance(padding, str):
        if padding == "valid":
            padding = (0,) * nd
        elif padding == "same":
            total = [d * (k - 1) for d, k in zip(dilation, weight.shape[2:])]
            if any(t % 2 for t in total):  # asymmetric: pad the extra element at the end, like torch
                pad: list[int] = []
                for t in reversed(total):
                    pad += [t // 2, t - t // 2]
                x = ctx.network.add_padding(x, pad, L.PaddingMode.CONSTANT).get_output()
                padding = (0,) * nd
            else:
                padding = tuple(t // 2 for t in total)
        else:
            raise ConversionError(f"unknown convolution padding {padding!r}")
    return ctx.network.add_convolution_nd(
        x, weight, bias, stride=stride, padding=expand_param(padding, nd), dilation=dilation, groups=groups,
        transposed=transposed, output_padding=expand_param(output_padding, nd) if transposed else (),
    ).get_output()
