"""Binary arithmetic converters: add, sub, rsub, mul, div, floor_divide, remainder, fmod, pow, atan2, and the
ternary addcmul and addcdiv (tensor, scalar and in-place forms)."""
from __future__ import annotations

from torchkiln.conversion.context import ConversionCtx
from torchkiln.conversion.impl.elementwise import binary, binary_converter, scaled
from torchkiln.conversion.impl.inplace import register_inplace
from torchkiln.analysis.registry import converter
from torchkiln.analysis.resolve import Args
from torchkiln.ir import layers as L
from torchkiln.ir.tensor import Tensor

OP = L.ElementWiseOperation


@converter("aten::add.Tensor", "aten::add.Scalar")
def add(ctx: ConversionCtx, args: Args) -> Tensor:
    return binary(ctx, args.self, scaled(ctx, args.other, args.alpha), OP.SUM)


@converter("aten::sub.Tensor", "aten::sub.Scalar")
def sub(ctx: ConversionCtx, args: Args) -> Tensor:
    return binary(ctx, args.self, scaled(ctx, args.other, args.alpha), OP.SUB)


@converter("aten::rsub.Scalar")
def rsub(ctx: ConversionCtx, args: Args) -> Tensor:
    """other - alpha * self (TorchScript writes a tensor rsub as aten::sub)."""
    return binary(ctx, args.other, scaled(ctx, args.self, args.alpha), OP.SUB)


@converter("aten::mul.Tensor", "aten::mul.Scalar")
def mul(ctx: ConversionCtx, args: Args) -> Tensor:
    return binary(ctx, args.self, args.other, OP.PROD)


_ROUNDING = {None: OP.DIV, "floor": OP.FLOOR_DIV, "trunc": OP.TRUNC_DIV}


def _rounding(args: Args) -> str | None:
    mode = args.get("rounding_mode")
    return None if mode in _ROUNDING else f"unknown rounding_mode {mode!r}"


@converter("aten::div.Tensor", "aten::div.Scalar", "aten::div.Tensor_mode", "aten::div.Scalar_mode",
           capability=_rounding)
def div(ctx: ConversionCtx, args: Args) -> Tensor:
    return binary(ctx, args.self, args.other, _ROUNDING[args.get("rounding_mode")])


def _integral_value(args: Args) -> str | None:
    if isinstance(args.value, float) and not args.self.dtype.is_floating_point:
        return "a float value with integer tensors raises in eager PyTorch"
    return None


def _float_quotient(args: Args) -> str | None:
    if not args.tensor1.dtype.is_floating_point and not args.tensor2.dtype.is_floating_point:
        return "addcdiv of integer tensors raises in eager PyTorch"
    return _integral_value(args)


@converter("aten::addcmul", capability=_integral_value)
def addcmul(ctx: ConversionCtx, args: Args) -> Tensor:
    """self + value * tensor1 * tensor2 (ResMLP's Affine: torch.addcmul(beta, alpha, x))."""
    return binary(ctx, args.self, binary(ctx, scaled(ctx, args.tensor1, args.value), args.tensor2, OP.PROD), OP.SUM)


@converter("aten::addcdiv", capability=_float_quotient)
def addcdiv(ctx: ConversionCtx, args: Args) -> Tensor:
    """self + value * tensor1 / tensor2."""
    return binary(ctx, args.self, binary(ctx, scaled(ctx, args.tensor1, args.value), args.tensor2, OP.DIV), OP.SUM)


register_inplace(add, "aten::add_.Tensor", "aten::add_.Scalar")
register_inplace(sub, "aten::sub_.Tensor", "aten::sub_.Scalar")
register_inplace(mul, "aten::mul_.Tensor", "aten::mul_.Scalar")
register_inplace(addcmul, "aten::addcmul_", capability=_integral_value)
register_inplace(addcdiv, "aten::addcdiv_", capability=_float_quotient)
register_inplace(div, "aten::div_.Tensor", "aten::div_.Scalar", "aten::div_.Tensor_mode", "aten::div_.Scalar_mode",
                 capability=_rounding)

# op -> (functional overloads, in-place overloads); self and other may each be a tensor or a scalar.
_BINARY = {
    OP.FLOOR_DIV: (("aten::floor_divide", "aten::floor_divide.Scalar"),
                   ("aten::floor_divide_.Tensor", "aten::floor_divide_.Scalar")),
    OP.REMAINDER: (("aten::remainder.Tensor", "aten::remainder.Scalar", "aten::remainder.Scalar_Tensor"),
                   ("aten::remainder_.Tensor", "aten::remainder_.Scalar")),
    OP.FMOD: (("aten::fmod.Tensor", "aten::fmod.Scalar"), ("aten::fmod_.Tensor", "aten::fmod_.Scalar")),
    OP.POW: (("aten::pow.Tensor_Tensor", "aten::pow.Tensor_Scalar", "aten::pow.Scalar"),
             ("aten::pow_.Tensor", "aten::pow_.Scalar")),
    OP.ATAN2: (("aten::atan2",), ("aten::atan2_",)),
}

for _op, (_functional, _inplace) in _BINARY.items():
    _convert = converter(*_functional)(binary_converter(_op))
    register_inplace(_convert, *_inplace)
