"""Fake quantization (quantize then dequantize), composed exactly as ATen's kernels compute it:
(clamp(round_half_even(x * (1 / scale)) + zero_point, quant_min, quant_max) - zero_point) * scale,
with 1 / scale computed in float32 and NaN quantized to quant_min."""
from __future__ import annotations

import torch

from torchkiln.conversion.context import ConversionCtx
from torchkiln.conversion.impl.common import is_tensor_like, needs_static, normalize_dim
from torchkiln.conversion.impl.elementwise import binary, unary
from torchkiln.analysis.registry import converter
from torchkiln.analysis.resolve import Args
from torchkiln.ir import layers as L
from torchkiln.ir.tensor import Tensor

E = L.ElementWiseOperation


def _fake_quantize(ctx: ConversionCtx, x: Tensor, scale: torch.Tensor, zero_point: torch.Tensor, lo: int, hi: int
                   ) -> Tensor:
    """scale and zero_point: float32 tensors that broadcast against x."""
    inverse = torch.ones_like(scale) / scale
    q = binary(ctx, unary(ctx, binary(ctx, x, inverse, E.PROD), L.UnaryOperation.ROUND), zero_point, E.SUM)
    q = ctx.network.add_activation(q, L.ActivationType.CLIP, lo, hi).get_output()
    q = ctx.network.add_select(unary(ctx, x, L.UnaryOperation.ISNAN), ctx.to_tensor(float(lo), torch.float32), q
                               ).get_output()
    return binary(ctx, binary(ctx, q, zero_point, E.SUB), scale, E.PROD)


def _fake_quantize_ok(args: Args) -> str | None:
    if args.self.dtype != torch.float32:
        return f"fake quantization of {args.self.dtype} (only float32 is composed exactly)"
    reason = needs_static(args, "scale", "zero_point")
    if reason:
        return reason
    zero_point = args.zero_point
    if is_tensor_like(zero_point) and zero_point.dtype.is_floating_point:
        return "a floating-point zero_point (ATen rounds differently for it)"
    return None


@converter("aten::fake_quantize_per_tensor_affine", "aten::fake_quantize_per_tensor_affine.tensor_qparams",
           capability=_fake_quantize_ok)
def fake_quantize_per_tensor_affine(ctx: ConversionCtx, args: Args) -> Tensor:
    scale = torch.as_tensor(args.scale, dtype=torch.float32).reshape(())
    zero_point = torch.as_tensor(args.zero_point).reshape(()).to(torch.float32)
    return _fake_quantize(ctx, ctx.to_tensor(args.self), scale, zero_point, args.quant_min, args.quant_max)


@converter("aten::fake_quantize_per_channel_affine", capability=_fake_quantize_ok)
def fake_quantize_per_channel_affine(ctx: ConversionCtx, args: Args) -> Tensor:
    x = ctx.to_tensor(args.self)
    axis = normalize_dim(args.axis, x.rank)
    shape = [-1] + [1] * (x.rank - axis - 1)
    scale = args.scale.to(torch.float32).reshape(shape)
    zero_point = args.zero_point.to(torch.float32).reshape(shape)
    return _fake_quantize(ctx, x, scale, zero_point, args.quant_min, args.quant_max)
