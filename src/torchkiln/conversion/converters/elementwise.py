"""Binary arithmetic converters: add, sub, mul, div (tensor, scalar and in-place forms)."""
from __future__ import annotations

from torchkiln.conversion.context import ConversionCtx
from torchkiln.conversion.impl.common import functional_inplace
from torchkiln.conversion.impl.elementwise import binary, scaled
from torchkiln.conversion.registry import converter
from torchkiln.conversion.resolve import Args
from torchkiln.network import layers as L
from torchkiln.network.tensor import Tensor

OP = L.ElementWiseOperation


@converter("aten::add.Tensor", "aten::add.Scalar")
def add(ctx: ConversionCtx, args: Args) -> Tensor:
    return binary(ctx, args.self, scaled(ctx, args.other, args.alpha), OP.SUM)


@converter("aten::add_.Tensor", "aten::add_.Scalar", capability=functional_inplace)
def add_(ctx: ConversionCtx, args: Args) -> Tensor:
    return add(ctx, args)


@converter("aten::sub.Tensor", "aten::sub.Scalar")
def sub(ctx: ConversionCtx, args: Args) -> Tensor:
    return binary(ctx, args.self, scaled(ctx, args.other, args.alpha), OP.SUB)


@converter("aten::sub_.Tensor", "aten::sub_.Scalar", capability=functional_inplace)
def sub_(ctx: ConversionCtx, args: Args) -> Tensor:
    return sub(ctx, args)


@converter("aten::mul.Tensor", "aten::mul.Scalar")
def mul(ctx: ConversionCtx, args: Args) -> Tensor:
    return binary(ctx, args.self, args.other, OP.PROD)


@converter("aten::mul_.Tensor", "aten::mul_.Scalar", capability=functional_inplace)
def mul_(ctx: ConversionCtx, args: Args) -> Tensor:
    return mul(ctx, args)


_ROUNDING = {None: OP.DIV, "floor": OP.FLOOR_DIV, "trunc": OP.TRUNC_DIV}


def _rounding(args: Args) -> str | None:
    mode = args.get("rounding_mode")
    return None if mode in _ROUNDING else f"unknown rounding_mode {mode!r}"


@converter("aten::div.Tensor", "aten::div.Scalar", "aten::div.Tensor_mode", "aten::div.Scalar_mode",
           capability=_rounding)
def div(ctx: ConversionCtx, args: Args) -> Tensor:
    return binary(ctx, args.self, args.other, _ROUNDING[args.get("rounding_mode")])


@converter("aten::div_.Tensor", "aten::div_.Scalar", "aten::div_.Tensor_mode", "aten::div_.Scalar_mode",
           capability=lambda args: _rounding(args) or functional_inplace(args))
def div_(ctx: ConversionCtx, args: Args) -> Tensor:
    return div(ctx, args)
