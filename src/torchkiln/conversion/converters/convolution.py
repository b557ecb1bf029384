"""Convolution converters: aten::_convolution, aten::convolution, aten::conv1d/2d/3d (and
aten::_convolution_mode, their string-padded form as tracing records it), aten::conv_transpose1d/2d/3d."""
from __future__ import annotations

from torchkiln.conversion.context import ConversionCtx
from torchkiln.conversion.impl.common import needs_static
from torchkiln.conversion.impl.convolution import convolution
from torchkiln.analysis.registry import converter
from torchkiln.analysis.resolve import Args
from torchkiln.ir.tensor import Tensor


def _static_weights(args: Args) -> str | None:
    return needs_static(args, "weight", "bias")


@converter("aten::_convolution", "aten::_convolution.deprecated", "aten::convolution", capability=_static_weights)
def convolution_full(ctx: ConversionCtx, args: Args) -> Tensor:
    return convolution(ctx, ctx.to_tensor(args.input), args.weight, args.bias, args.stride, args.padding,
                       args.dilation, args.groups, args.transposed, args.output_padding)


@converter("aten::conv1d", "aten::conv2d", "aten::conv3d", "aten::conv1d.padding", "aten::conv2d.padding",
           "aten::conv3d.padding", "aten::_convolution_mode", capability=_static_weights)
def conv_nd(ctx: ConversionCtx, args: Args) -> Tensor:
    return convolution(ctx, ctx.to_tensor(args.input), args.weight, args.bias, args.stride, args.padding,
                       args.dilation, args.groups)


@converter("aten::conv_transpose1d", "aten::conv_transpose2d.input", "aten::conv_transpose3d.input",
           capability=_static_weights)
def conv_transpose_nd(ctx: ConversionCtx, args: Args) -> Tensor:
    return convolution(ctx, ctx.to_tensor(args.input), args.weight, args.bias, args.stride, args.padding,
                       args.dilation, args.groups, transposed=True, output_padding=args.output_padding)
