"""Unary elementwise converters: math functions, rounding, sign, logical and bitwise not, finiteness
(and their in-place forms), and the compositions deg2rad, rad2deg, exp2, frac and sgn. Integer inputs to
float functions give float, as in eager."""
from __future__ import annotations

import math

import torch

from torchkiln.conversion.context import ConversionCtx
from torchkiln.conversion.impl.elementwise import binary, select, unary, unary_converter
from torchkiln.conversion.impl.inplace import register_inplace
from torchkiln.analysis.registry import converter
from torchkiln.analysis.resolve import Args
from torchkiln.ir import layers as L
from torchkiln.ir.pointwise import UNARY
from torchkiln.ir.tensor import Tensor

U, E = L.UnaryOperation, L.ElementWiseOperation

# No in-place forms: isinf & co. have none; logical_not_ is rewritten by lowering (remove_mutation) so that
# it keeps its tensor's dtype.
_NO_INPLACE = ("isinf", "isneginf", "isposinf", "isnan", "isfinite", "logical_not")

for _op, _row in UNARY.items():  # each unary op's row names the ATen op it converts
    if _row.aten:
        _convert = converter(f"aten::{_row.aten}")(unary_converter(_op))
        if _row.aten not in _NO_INPLACE and hasattr(torch.Tensor, f"{_row.aten}_"):  # special_* have none
            register_inplace(_convert, f"aten::{_row.aten}_")

converter("prim::abs")(unary_converter(U.ABS))  # Python's abs() on a tensor


@converter("aten::round.decimals")
def round_decimals(ctx: ConversionCtx, args: Args) -> Tensor:
    """round(x * 10**d) / 10**d (for d < 0: round(x / 10**-d) * 10**-d), as ATen computes it
    (half-precision inputs in float32)."""
    x, decimals = ctx.to_tensor(args.self), args.decimals
    if decimals == 0:
        return unary(ctx, x, U.ROUND)
    wide = ctx.to_tensor(x, torch.float32 if x.dtype in (torch.float16, torch.bfloat16) else None)
    scale = ctx.to_tensor(10.0 ** abs(decimals), wide.dtype)
    inward, outward = (E.PROD, E.DIV) if decimals > 0 else (E.DIV, E.PROD)
    rounded = binary(ctx, unary(ctx, binary(ctx, wide, scale, inward), U.ROUND), scale, outward)
    return ctx.to_tensor(rounded, x.dtype)


register_inplace(round_decimals, "aten::round_.decimals")


def _real(args: Args) -> str | None:
    return "complex tensors are not supported" if args.self.dtype.is_complex else None


def _floating(args: Args) -> str | None:
    if not args.self.dtype.is_floating_point:
        return f"{args.node.kind()} of a {args.self.dtype} tensor raises in eager PyTorch"
    return None


def _as_float(ctx: ConversionCtx, x: Tensor) -> Tensor:
    """Integer and bool inputs of float functions compute in the default float dtype, as in eager."""
    return x if x.dtype.is_floating_point else ctx.to_tensor(x, torch.get_default_dtype())


converter("aten::sgn", capability=_real)(unary_converter(U.SIGN))  # sgn of a real tensor is its sign


@converter("aten::deg2rad", capability=_real)
def deg2rad(ctx: ConversionCtx, args: Args) -> Tensor:
    return binary(ctx, _as_float(ctx, ctx.to_tensor(args.self)), math.pi / 180, E.PROD)


@converter("aten::rad2deg", capability=_real)
def rad2deg(ctx: ConversionCtx, args: Args) -> Tensor:
    return binary(ctx, _as_float(ctx, ctx.to_tensor(args.self)), 180 / math.pi, E.PROD)


@converter("aten::exp2", capability=_real)
def exp2(ctx: ConversionCtx, args: Args) -> Tensor:
    return binary(ctx, 2.0, _as_float(ctx, ctx.to_tensor(args.self)), E.POW)


@converter("aten::frac", capability=_floating)
def frac(ctx: ConversionCtx, args: Args) -> Tensor:
    """x - trunc(x), as ATen computes it (so frac(+-inf) is NaN)."""
    x = ctx.to_tensor(args.self)
    return binary(ctx, x, unary(ctx, x, U.TRUNC), E.SUB)


@converter("aten::nan_to_num")
def nan_to_num(ctx: ConversionCtx, args: Args) -> Tensor:
    """NaN, +inf and -inf replaced (by 0 and the dtype's largest and lowest finite values unless given); integers
    unchanged."""
    x = ctx.to_tensor(args.self)
    if not x.dtype.is_floating_point:
        return x
    info = torch.finfo(x.dtype)
    nan = 0.0 if args.nan is None else args.nan
    posinf = info.max if args.posinf is None else args.posinf
    neginf = info.min if args.neginf is None else args.neginf
    out = select(ctx, unary(ctx, x, U.ISPOSINF), ctx.to_tensor(torch.tensor(posinf, dtype=x.dtype)), x)
    out = select(ctx, unary(ctx, x, U.ISNEGINF), ctx.to_tensor(torch.tensor(neginf, dtype=x.dtype)), out)
    return select(ctx, unary(ctx, x, U.ISNAN), ctx.to_tensor(torch.tensor(nan, dtype=x.dtype)), out)


register_inplace(nan_to_num, "aten::nan_to_num_")


@converter("aten::isreal")
def isreal(ctx: ConversionCtx, args: Args) -> Tensor:
    """Of a real tensor, True everywhere (isnan or not isnan: the input's shape, static or not)."""
    nan = unary(ctx, args.self, U.ISNAN)
    return binary(ctx, nan, unary(ctx, nan, U.NOT), E.OR)


@converter("aten::angle", capability=_floating)
def angle(ctx: ConversionCtx, args: Args) -> Tensor:
    """Of a real tensor: pi below 0, else 0; NaN stays NaN."""
    x = ctx.to_tensor(args.self)
    out = select(ctx, binary(ctx, x, 0.0, E.LESS), ctx.to_tensor(torch.tensor(math.pi, dtype=x.dtype)),
                 ctx.to_tensor(torch.tensor(0.0, dtype=x.dtype)))
    return select(ctx, unary(ctx, x, U.ISNAN), x, out)
