"""Binary arithmetic converters: add, sub, rsub, mul, div, floor_divide, remainder, fmod, pow, atan2, the
special functions of two arguments (zeta, igamma, nextafter, copysign, heaviside, logaddexp2, ldexp, xlog1py, the
orthogonal polynomials: rows of ir/pointwise.py), the ternary addcmul and addcdiv (tensor, scalar and in-place
forms), and the compositions logaddexp, hypot, fmax, fmin, xlogy, lerp and float_power (with eager's NaN and
infinity rules). NumPy's names multiply, subtract and divide (a trace keeps them) are mul, sub and div."""
from __future__ import annotations

import torch

from torchkiln.conversion.context import ConversionCtx
from torchkiln.conversion.impl.elementwise import binary, binary_converter, dtype_of, scaled, select, unary
from torchkiln.conversion.impl.common import is_tensor_like, one_dtype
from torchkiln.conversion.impl.inplace import register_inplace
from torchkiln.analysis.registry import converter
from torchkiln.analysis.resolve import Args
from torchkiln.ir import layers as L
from torchkiln.ir.tensor import Tensor

OP = L.ElementWiseOperation
U = L.UnaryOperation


@converter("aten::add.Tensor", "aten::add.Scalar")
def add(ctx: ConversionCtx, args: Args) -> Tensor:
    return binary(ctx, args.self, scaled(ctx, args.other, args.alpha), OP.SUM)


@converter("aten::sub.Tensor", "aten::sub.Scalar", "aten::subtract.Tensor", "aten::subtract.Scalar")
def sub(ctx: ConversionCtx, args: Args) -> Tensor:
    return binary(ctx, args.self, scaled(ctx, args.other, args.alpha), OP.SUB)


@converter("aten::rsub.Scalar")
def rsub(ctx: ConversionCtx, args: Args) -> Tensor:
    """other - alpha * self (TorchScript writes a tensor rsub as aten::sub)."""
    return binary(ctx, args.other, scaled(ctx, args.self, args.alpha), OP.SUB)


@converter("aten::mul.Tensor", "aten::mul.Scalar", "aten::multiply.Tensor", "aten::multiply.Scalar")
def mul(ctx: ConversionCtx, args: Args) -> Tensor:
    return binary(ctx, args.self, args.other, OP.PROD)


_ROUNDING = {None: OP.DIV, "floor": OP.FLOOR_DIV, "trunc": OP.TRUNC_DIV}


def _rounding(args: Args) -> str | None:
    mode = args.get("rounding_mode")
    return None if mode in _ROUNDING else f"unknown rounding_mode {mode!r}"


@converter("aten::div.Tensor", "aten::div.Scalar", "aten::div.Tensor_mode", "aten::div.Scalar_mode",
           "aten::divide.Tensor", "aten::divide.Scalar", "aten::divide.Tensor_mode", "aten::divide.Scalar_mode",
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
    OP.IGAMMA: (("aten::igamma",), ("aten::igamma_",)),
    OP.IGAMMAC: (("aten::igammac",), ("aten::igammac_",)),
    OP.NEXTAFTER: (("aten::nextafter",), ("aten::nextafter_",)),
    OP.COPYSIGN: (("aten::copysign.Tensor", "aten::copysign.Scalar"),
                  ("aten::copysign_.Tensor", "aten::copysign_.Scalar")),
    OP.HEAVISIDE: (("aten::heaviside",), ("aten::heaviside_",)),
    OP.LOGADDEXP2: (("aten::logaddexp2",), ()),
    OP.LDEXP: (("aten::ldexp.Tensor",), ("aten::ldexp_",)),
    **{op: ((f"aten::special_{name}", *(f"aten::special_{name}.{o}" for o in overloads)), ())
       for op, name, overloads in (
        (OP.ZETA, "zeta", ("self_scalar", "other_scalar")),
        (OP.XLOG1PY, "xlog1py", ("self_scalar", "other_scalar")),
        *((op, f"{name}_polynomial_{k}", ("x_scalar", "n_scalar")) for op, name, k in (
            (OP.CHEBYSHEV_T, "chebyshev", "t"), (OP.CHEBYSHEV_U, "chebyshev", "u"),
            (OP.CHEBYSHEV_V, "chebyshev", "v"), (OP.CHEBYSHEV_W, "chebyshev", "w"),
            (OP.SHIFTED_CHEBYSHEV_T, "shifted_chebyshev", "t"), (OP.SHIFTED_CHEBYSHEV_U, "shifted_chebyshev", "u"),
            (OP.SHIFTED_CHEBYSHEV_V, "shifted_chebyshev", "v"), (OP.SHIFTED_CHEBYSHEV_W, "shifted_chebyshev", "w"),
            (OP.HERMITE_H, "hermite", "h"), (OP.HERMITE_HE, "hermite", "he"),
            (OP.LAGUERRE_L, "laguerre", "l"), (OP.LEGENDRE_P, "legendre", "p"))))},
}

for _op, (_functional, _inplace) in _BINARY.items():
    _convert = converter(*_functional)(binary_converter(_op))
    if _inplace:
        register_inplace(_convert, *_inplace)


def _float_tensors(args: Args) -> str | None:
    """logaddexp and hypot: both operands real floating tensors of one dtype (integers raise in eager)."""
    a, b = args.self, args.other
    if not a.dtype.is_floating_point or a.dtype != b.dtype:
        return f"operands of dtypes {a.dtype} and {b.dtype} (only two tensors of one floating dtype are converted)"
    return None


@converter("aten::logaddexp", capability=_float_tensors)
def logaddexp(ctx: ConversionCtx, args: Args) -> Tensor:
    """max(a, b) + log1p(exp(-|a - b|)), and a where a == b is infinite, as ATen computes it."""
    a, b = ctx.to_tensor(args.self), ctx.to_tensor(args.other)
    tail = unary(ctx, unary(ctx, unary(ctx, unary(ctx, binary(ctx, a, b, OP.SUB), U.ABS), U.NEG), U.EXP), U.LOG1P)
    out = binary(ctx, binary(ctx, a, b, OP.MAX), tail, OP.SUM)
    same_infinity = binary(ctx, unary(ctx, a, U.ISINF), binary(ctx, a, b, OP.EQUAL), OP.AND)
    return select(ctx, same_infinity, a, out)


@converter("aten::hypot", capability=_float_tensors)
def hypot(ctx: ConversionCtx, args: Args) -> Tensor:
    """m * sqrt(1 + (n / m)**2) with m = max(|a|, |b|), n = min(|a|, |b|) (no overflow where a*a would), 0 where
    m is 0; +inf where either is infinite (even if the other is NaN), NaN where either is NaN, as std::hypot."""
    a, b = unary(ctx, args.self, U.ABS), unary(ctx, args.other, U.ABS)
    m, n = binary(ctx, a, b, OP.MAX), binary(ctx, a, b, OP.MIN)
    ratio = binary(ctx, n, m, OP.DIV)
    out = binary(ctx, m, unary(ctx, binary(ctx, unary(ctx, ratio, U.SQUARE), 1.0, OP.SUM), U.SQRT), OP.PROD)
    out = select(ctx, binary(ctx, m, 0.0, OP.EQUAL), 0.0, out)
    nan = binary(ctx, unary(ctx, a, U.ISNAN), unary(ctx, b, U.ISNAN), OP.OR)
    out = select(ctx, nan, float("nan"), out)
    inf = binary(ctx, unary(ctx, a, U.ISINF), unary(ctx, b, U.ISINF), OP.OR)
    return select(ctx, inf, float("inf"), out)


def _nan_ignoring(op: OP):
    """fmax / fmin: max / min where the NaN operand (if one is) loses."""
    def convert(ctx: ConversionCtx, args: Args) -> Tensor:
        a, b = ctx.to_tensor(args.self), ctx.to_tensor(args.other)
        out = binary(ctx, a, b, op)
        if not out.dtype.is_floating_point:
            return out
        out = select(ctx, unary(ctx, b, U.ISNAN), a, out)
        return select(ctx, unary(ctx, a, U.ISNAN), b, out)

    return convert


def _one_real_dtype(args: Args) -> str | None:
    """Tensor operands of one real, non-bool dtype (mixed dtypes would need eager's promotion rules)."""
    dtypes = {x.dtype for x in (args[0], args[1]) if is_tensor_like(x)}
    if len(dtypes) != 1 or next(iter(dtypes)).is_complex or torch.bool in dtypes:
        return f"operand dtypes {sorted(map(str, dtypes))} (only one real, non-bool dtype is converted)"
    return None


converter("aten::fmax", capability=_one_real_dtype)(_nan_ignoring(OP.MAX))
converter("aten::fmin", capability=_one_real_dtype)(_nan_ignoring(OP.MIN))


@converter("aten::xlogy.Tensor", "aten::xlogy.Scalar_Self", "aten::xlogy.Scalar_Other", capability=_one_real_dtype)
def xlogy(ctx: ConversionCtx, args: Args) -> Tensor:
    """x * log(y); 0 where x == 0 (even where y is 0 or inf), NaN where y is NaN, as ATen computes it."""
    x, y = args[0], args[1]
    dtype = next(dtype_of(v) for v in (x, y) if dtype_of(v) is not None)
    dtype = dtype if dtype.is_floating_point else torch.get_default_dtype()
    x, y = ctx.to_tensor(x, dtype), ctx.to_tensor(y, dtype)
    out = binary(ctx, x, unary(ctx, y, U.LOG), OP.PROD)
    out = select(ctx, binary(ctx, x, 0.0, OP.EQUAL), 0.0, out)
    return select(ctx, unary(ctx, y, U.ISNAN), float("nan"), out)


_LERP_OK = one_dtype("self", "end", "weight", floating=True)


@converter("aten::lerp.Scalar", "aten::lerp.Tensor", capability=_LERP_OK)
def lerp(ctx: ConversionCtx, args: Args) -> Tensor:
    """self + w (end - self) where |w| < 0.5, else end - (end - self)(1 - w), as ATen computes it."""
    x, end, w = ctx.to_tensor(args.self), ctx.to_tensor(args.end), args.weight
    diff = binary(ctx, end, x, OP.SUB)
    if not is_tensor_like(w):
        return binary(ctx, x, binary(ctx, diff, w, OP.PROD), OP.SUM) if abs(w) < 0.5 else \
            binary(ctx, end, binary(ctx, diff, 1.0 - w, OP.PROD), OP.SUB)
    w = ctx.to_tensor(w)
    small = binary(ctx, unary(ctx, w, U.ABS), 0.5, OP.LESS)
    return select(ctx, small, binary(ctx, x, binary(ctx, w, diff, OP.PROD), OP.SUM),
                  binary(ctx, end, binary(ctx, diff, binary(ctx, 1.0, w, OP.SUB), OP.PROD), OP.SUB))


register_inplace(lerp, "aten::lerp_.Scalar", "aten::lerp_.Tensor", capability=_LERP_OK)


def _real_operands(args: Args) -> str | None:
    if any(is_tensor_like(v) and (v.dtype.is_complex or v.dtype == torch.bool) for v in (args[0], args[1])):
        return "complex or bool operands"
    return None


@converter("aten::float_power.Tensor_Tensor", "aten::float_power.Tensor_Scalar", "aten::float_power.Scalar",
           capability=_real_operands)
def float_power(ctx: ConversionCtx, args: Args) -> Tensor:
    """pow of both operands in float64."""
    return binary(ctx, ctx.to_tensor(args[0], torch.float64), ctx.to_tensor(args[1], torch.float64), OP.POW)
