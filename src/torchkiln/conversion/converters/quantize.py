"""Fake quantization (quantize then dequantize), exactly as ATen's kernels compute it:
(clamp(round_half_even(x * (1 / scale)) + zero_point, quant_min, quant_max) - zero_point) * scale,
with 1 / scale computed in float32 and NaN quantized to quant_min.

A range of at most 256 values (int8, uint8, 4-bit: every QAT model's) becomes a quantize-dequantize layer pair in
int8 with the graph's own scales, the range moved into int8's where it lies outside (uint8's 0..255 with zero point z
is int8's -128..127 with zero point z - 128: the same values), so backends see an explicitly quantized value
(TensorRT's Q/DQ) and post-training quantization leaves it as the graph has it. A wider range is composed of
elementwise layers."""
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


def _fake_quantize(ctx: ConversionCtx, x: Tensor, scale: torch.Tensor, zero_point: torch.Tensor, lo: int, hi: int,
                   axis: int | None = None) -> Tensor:
    """scale and zero_point: float32 tensors that broadcast against x (one value, or one per channel of `axis`)."""
    shift = 0 if -128 <= lo and hi <= 127 else lo + 128  # moves [lo, hi] into int8's range where it fits there
    zero = zero_point.reshape(-1) - shift
    if hi - lo <= 255 and bool(((zero >= -128) & (zero <= 127)).all()):
        return ctx.network.add_fake_quantize(x, scale.reshape(-1), zero.to(torch.int8), torch.int8, axis,
                                             (lo - shift, hi - shift))
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
    return _fake_quantize(ctx, x, scale, zero_point, args.quant_min, args.quant_max, axis)
