"""One table per pointwise op family (binary elementwise, unary, activation): each op's reference meaning, its
dtype rule, and the slots the backends fill: how the ONNX exporter writes it (or why it declines) and the
Triton expression a generated kernel computes it with (None: no kernel yet, so the op is not fused).

Adding an op is one row here (and its enum member in `layers`), plus one test row.

Triton expressions are Python templates over float32 values: `{x}` (unary, activation), `{a}` and `{b}`
(binary), and the activation's `{alpha}` and `{beta}` (literals) and `{div}` (its division: IEEE `tl.div_rn`, or the
GPU's approximate one where the kernel allows it; runtime/backends/cuda/codegen/pointwise.py). An op computing integers
(or bools, for the bitwise ones) has a second template, `integer`, over values of its result's dtype (`{t}`: that Triton
type; an activation's `{alpha}` and `{beta}` are values of it, an infinite one the type's limit), with ATen's integer
semantics: two's complement wrap-around, floor division and remainder as Python's. Templates may call `tl.*`,
`libdevice.*` (`triton.language.extra.libdevice`) and the generated kernels' own helpers (`_erf`: codegen/pointwise.py's
HEADER); Triton's CPU interpreter runs no libdevice function, so only rows without one are checked there (see
`uses_libdevice`).
"""
from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable, Iterable

import torch
import torch.nn.functional as F

from torchkiln.ir import layers as L

E, U, A = L.ElementWiseOperation, L.UnaryOperation, L.ActivationType


class DtypeRule(enum.Enum):
    """The result dtype of an op from its operands' dtypes (see `result_dtype`)."""

    PROMOTE = "promote"  # torch's type promotion of the operands
    FLOAT = "float"  # promotion, then integers and bool give the default float dtype
    SAME = "same"  # the input's dtype (integers computed natively)
    SQUARE = "square"  # the input's dtype, but bool gives int64 (torch.square is pow(x, 2))
    COMPARE = "compare"  # bool; the operands compared in their promoted dtype
    LOGICAL = "logical"  # bool; the operands read as bool
    PREDICATE = "predicate"  # bool; a test of a float value (integers are finite)


def result_dtype(rule: DtypeRule, dtypes: Iterable[torch.dtype]) -> torch.dtype:
    """The dtype an op of `rule` gives for operands of `dtypes`."""
    dtypes = list(dtypes)
    if rule in (DtypeRule.COMPARE, DtypeRule.LOGICAL, DtypeRule.PREDICATE):
        return torch.bool
    if rule == DtypeRule.SAME or (rule == DtypeRule.SQUARE and dtypes[0] != torch.bool):
        return dtypes[0]
    promoted = dtypes[0]
    for d in dtypes[1:]:
        promoted = torch.promote_types(promoted, d)
    if rule == DtypeRule.SQUARE:
        return torch.int64
    if rule == DtypeRule.FLOAT and not promoted.is_floating_point:
        return torch.get_default_dtype()
    return promoted


@dataclasses.dataclass(frozen=True)
class Onnx:
    """How the ONNX exporter writes an op: one node of `op_type` (with `attrs`, where the value "alpha" or "beta"
    reads the layer's parameter), a composition `recipe` the exporter defines, or `declined`: why it has none."""

    op_type: str = ""
    attrs: tuple[tuple[str, object], ...] = ()
    recipe: str = ""
    declined: str = ""


def node(op_type: str, **attrs: object) -> Onnx:
    return Onnx(op_type=op_type, attrs=tuple(attrs.items()))


def recipe(name: str) -> Onnx:
    return Onnx(recipe=name)


def declined(reason: str) -> Onnx:
    return Onnx(declined=reason)


@dataclasses.dataclass(frozen=True)
class PointwiseOp:
    """One row: the reference meaning (ATen), the ONNX slot, the Triton expression slot, the dtype rule, the
    ATen op (`aten::<name>` and its in-place form) the family's generic converter maps to it ("": a converter of
    its own reads more arguments), and the Triton expression over integers."""

    reference: Callable[..., torch.Tensor]
    onnx: Onnx
    triton: str | None
    dtype: DtypeRule = DtypeRule.SAME
    aten: str = ""
    integer: str | None = None  # the Triton expression over integers (None: integer results are not fused)

    @property
    def uses_libdevice(self) -> bool:
        return self.triton is not None and "libdevice." in self.triton


def _clip(x: torch.Tensor, lo: float, hi: float) -> torch.Tensor:
    def bound(v: float) -> float | int | None:
        if v in (float("inf"), float("-inf")):
            return None
        return int(v) if not x.dtype.is_floating_point and float(v).is_integer() else v

    return torch.clamp(x, bound(lo), bound(hi))


P = PointwiseOp


def _no_onnx(what: str) -> Onnx:
    """A special function ONNX has no op for: the onnxruntime backend runs its layer on the reference."""
    return declined(f"ONNX has no {what} op")


_INEXACT_EDGES = "composing one would not be exact at its edges (signed zeros, infinities)"
# NaN-propagating max/min and clamp (tl.maximum/minimum may return the other operand for NaN).
_NAN = "{a} != {a}) | ({b} != {b}"
_CLAMP = "tl.where({x} != {x}, {x}, tl.minimum(tl.maximum({x}, {alpha}), {beta}))"
_INT_CLAMP = "tl.minimum(tl.maximum({x}, {alpha}), {beta})"  # integer bounds (infinite ones: the type's limits)
_RELU6_OVER_6 = "tl.minimum(tl.maximum({x} + 3.0, 0.0), 6.0) * 0.16666666666666666"
# Triton's integer // and % truncate toward zero (C's division); torch's floor division and remainder are Python's.
_TRUNC_REM_FIX = "(({a} % {b} != 0) & (({a} % {b} < 0) != ({b} < 0)))"
_SELU_ALPHA, _SELU_SCALE = 1.6732632423543772848170429916717, 1.0507009873554804934193349852946

ELEMENTWISE: dict[L.ElementWiseOperation, PointwiseOp] = {
    E.SUM: P(torch.add, node("Add"), "{a} + {b}", DtypeRule.PROMOTE, integer="{a} + {b}"),
    E.PROD: P(torch.mul, node("Mul"), "{a} * {b}", DtypeRule.PROMOTE, integer="{a} * {b}"),
    E.MAX: P(torch.maximum, node("Max"), f"tl.where(({_NAN}), {{a}} + {{b}}, tl.maximum({{a}}, {{b}}))",
             DtypeRule.PROMOTE, integer="tl.maximum({a}, {b})"),
    E.MIN: P(torch.minimum, node("Min"), f"tl.where(({_NAN}), {{a}} + {{b}}, tl.minimum({{a}}, {{b}}))",
             DtypeRule.PROMOTE, integer="tl.minimum({a}, {b})"),
    E.SUB: P(torch.sub, node("Sub"), "{a} - {b}", DtypeRule.PROMOTE, integer="{a} - {b}"),
    E.DIV: P(torch.div, node("Div"), "tl.div_rn({a}, {b})", DtypeRule.FLOAT),
    E.FLOOR_DIV: P(lambda a, b: torch.div(a, b, rounding_mode="floor"), recipe("floor_div"), None,
                   DtypeRule.PROMOTE, integer=f"{{a}} // {{b}} - {_TRUNC_REM_FIX}.to({{t}})"),
    E.TRUNC_DIV: P(lambda a, b: torch.div(a, b, rounding_mode="trunc"), recipe("trunc_div"),
                   "tl.where(tl.div_rn({a}, {b}) < 0, tl.ceil(tl.div_rn({a}, {b})), tl.floor(tl.div_rn({a}, {b})))",
                   DtypeRule.PROMOTE, integer="{a} // {b}"),
    E.POW: P(torch.pow, node("Pow"), "libdevice.pow({a}, {b})", DtypeRule.PROMOTE),
    E.REMAINDER: P(torch.remainder, recipe("remainder"),
                   "tl.where((libdevice.fmod({a}, {b}) != 0) & ((libdevice.fmod({a}, {b}) < 0) != ({b} < 0)), "
                   "libdevice.fmod({a}, {b}) + {b}, libdevice.fmod({a}, {b}))",
                   DtypeRule.PROMOTE, integer=f"tl.where({_TRUNC_REM_FIX}, {{a}} % {{b}} + {{b}}, {{a}} % {{b}})"),
    # Triton's float % is not C's fmod at the edges (on CUDA, inf % inf gives inf, not NaN): libdevice's is.
    E.FMOD: P(torch.fmod, node("Mod", fmod=1), "libdevice.fmod({a}, {b})", DtypeRule.PROMOTE, integer="{a} % {b}"),
    E.ATAN2: P(torch.atan2, declined(f"ONNX has no atan2 op, and {_INEXACT_EDGES}"), "libdevice.atan2({a}, {b})",
               DtypeRule.FLOAT),
    E.AND: P(torch.logical_and, node("And"), "({a} != 0) & ({b} != 0)", DtypeRule.LOGICAL),
    E.OR: P(torch.logical_or, node("Or"), "({a} != 0) | ({b} != 0)", DtypeRule.LOGICAL),
    E.XOR: P(torch.logical_xor, node("Xor"), "({a} != 0) ^ ({b} != 0)", DtypeRule.LOGICAL),
    E.EQUAL: P(torch.eq, node("Equal"), "{a} == {b}", DtypeRule.COMPARE),
    E.NOT_EQUAL: P(torch.ne, recipe("not_equal"), "{a} != {b}", DtypeRule.COMPARE),
    E.GREATER: P(torch.gt, node("Greater"), "{a} > {b}", DtypeRule.COMPARE),
    E.GREATER_EQUAL: P(torch.ge, node("GreaterOrEqual"), "{a} >= {b}", DtypeRule.COMPARE),
    E.LESS: P(torch.lt, node("Less"), "{a} < {b}", DtypeRule.COMPARE),
    E.LESS_EQUAL: P(torch.le, node("LessOrEqual"), "{a} <= {b}", DtypeRule.COMPARE),
    E.BITWISE_AND: P(torch.bitwise_and, node("BitwiseAnd"), None, DtypeRule.PROMOTE, integer="{a} & {b}"),
    E.BITWISE_OR: P(torch.bitwise_or, node("BitwiseOr"), None, DtypeRule.PROMOTE, integer="{a} | {b}"),
    E.BITWISE_XOR: P(torch.bitwise_xor, node("BitwiseXor"), None, DtypeRule.PROMOTE, integer="{a} ^ {b}"),
    **{op: P(fn, _no_onnx(name), None, rule) for op, (fn, name, rule) in {
        E.ZETA: (torch.special.zeta, "zeta", DtypeRule.FLOAT),
        E.IGAMMA: (torch.igamma, "igamma", DtypeRule.FLOAT),
        E.IGAMMAC: (torch.igammac, "igammac", DtypeRule.FLOAT),
        E.NEXTAFTER: (torch.nextafter, "nextafter", DtypeRule.PROMOTE),
        E.COPYSIGN: (torch.copysign, "copysign (a sign bit: -0.0 and -NaN)", DtypeRule.FLOAT),
        E.HEAVISIDE: (torch.heaviside, "heaviside", DtypeRule.PROMOTE),
        E.LOGADDEXP2: (torch.logaddexp2, "logaddexp2", DtypeRule.FLOAT),
        E.LDEXP: (torch.ldexp, "ldexp", DtypeRule.FLOAT),
        E.XLOG1PY: (torch.special.xlog1py, "xlog1py", DtypeRule.FLOAT),
        E.CHEBYSHEV_T: (torch.special.chebyshev_polynomial_t, "Chebyshev polynomial", DtypeRule.FLOAT),
        E.CHEBYSHEV_U: (torch.special.chebyshev_polynomial_u, "Chebyshev polynomial", DtypeRule.FLOAT),
        E.CHEBYSHEV_V: (torch.special.chebyshev_polynomial_v, "Chebyshev polynomial", DtypeRule.FLOAT),
        E.CHEBYSHEV_W: (torch.special.chebyshev_polynomial_w, "Chebyshev polynomial", DtypeRule.FLOAT),
        E.SHIFTED_CHEBYSHEV_T: (torch.special.shifted_chebyshev_polynomial_t, "Chebyshev polynomial",
                                DtypeRule.FLOAT),
        E.SHIFTED_CHEBYSHEV_U: (torch.special.shifted_chebyshev_polynomial_u, "Chebyshev polynomial",
                                DtypeRule.FLOAT),
        E.SHIFTED_CHEBYSHEV_V: (torch.special.shifted_chebyshev_polynomial_v, "Chebyshev polynomial",
                                DtypeRule.FLOAT),
        E.SHIFTED_CHEBYSHEV_W: (torch.special.shifted_chebyshev_polynomial_w, "Chebyshev polynomial",
                                DtypeRule.FLOAT),
        E.HERMITE_H: (torch.special.hermite_polynomial_h, "Hermite polynomial", DtypeRule.FLOAT),
        E.HERMITE_HE: (torch.special.hermite_polynomial_he, "Hermite polynomial", DtypeRule.FLOAT),
        E.LAGUERRE_L: (torch.special.laguerre_polynomial_l, "Laguerre polynomial", DtypeRule.FLOAT),
        E.LEGENDRE_P: (torch.special.legendre_polynomial_p, "Legendre polynomial", DtypeRule.FLOAT),
    }.items()},
}

UNARY: dict[L.UnaryOperation, PointwiseOp] = {
    U.EXP: P(torch.exp, node("Exp"), "tl.exp({x})", DtypeRule.FLOAT, aten="exp"),
    U.EXPM1: P(torch.expm1, recipe("expm1"), "libdevice.expm1({x})", DtypeRule.FLOAT, aten="expm1"),
    U.LOG: P(torch.log, node("Log"), "tl.log({x})", DtypeRule.FLOAT, aten="log"),
    U.LOG2: P(torch.log2, recipe("log2"), "tl.log2({x})", DtypeRule.FLOAT, aten="log2"),
    U.LOG10: P(torch.log10, recipe("log10"), "libdevice.log10({x})", DtypeRule.FLOAT, aten="log10"),
    U.LOG1P: P(torch.log1p, recipe("log1p"), "libdevice.log1p({x})", DtypeRule.FLOAT, aten="log1p"),
    U.SQRT: P(torch.sqrt, node("Sqrt"), "tl.sqrt_rn({x})", DtypeRule.FLOAT, aten="sqrt"),
    U.RSQRT: P(torch.rsqrt, recipe("rsqrt"), "tl.rsqrt({x})", DtypeRule.FLOAT, aten="rsqrt"),
    U.RECIP: P(torch.reciprocal, node("Reciprocal"), "tl.div_rn(1.0, {x})", DtypeRule.FLOAT, aten="reciprocal"),
    U.ABS: P(torch.abs, node("Abs"), "tl.abs({x})", aten="abs", integer="tl.where({x} < 0, -{x}, {x})"),
    U.NEG: P(torch.neg, node("Neg"), "-{x}", aten="neg", integer="-{x}"),
    U.SIN: P(torch.sin, node("Sin"), "tl.sin({x})", DtypeRule.FLOAT, aten="sin"),
    U.COS: P(torch.cos, node("Cos"), "tl.cos({x})", DtypeRule.FLOAT, aten="cos"),
    U.TAN: P(torch.tan, node("Tan"), "libdevice.tan({x})", DtypeRule.FLOAT, aten="tan"),
    U.SINH: P(torch.sinh, node("Sinh"), "libdevice.sinh({x})", DtypeRule.FLOAT, aten="sinh"),
    U.COSH: P(torch.cosh, node("Cosh"), "libdevice.cosh({x})", DtypeRule.FLOAT, aten="cosh"),
    U.ASIN: P(torch.asin, node("Asin"), "libdevice.asin({x})", DtypeRule.FLOAT, aten="asin"),
    U.ACOS: P(torch.acos, node("Acos"), "libdevice.acos({x})", DtypeRule.FLOAT, aten="acos"),
    U.ATAN: P(torch.atan, node("Atan"), "libdevice.atan({x})", DtypeRule.FLOAT, aten="atan"),
    U.ASINH: P(torch.asinh, node("Asinh"), "libdevice.asinh({x})", DtypeRule.FLOAT, aten="asinh"),
    U.ACOSH: P(torch.acosh, node("Acosh"), "libdevice.acosh({x})", DtypeRule.FLOAT, aten="acosh"),
    U.ATANH: P(torch.atanh, node("Atanh"), "libdevice.atanh({x})", DtypeRule.FLOAT, aten="atanh"),
    U.CEIL: P(torch.ceil, node("Ceil"), "tl.ceil({x})", aten="ceil", integer="{x}"),
    U.FLOOR: P(torch.floor, node("Floor"), "tl.floor({x})", aten="floor", integer="{x}"),
    U.ROUND: P(torch.round, node("Round"), "libdevice.rint({x})", aten="round", integer="{x}"),  # half to even
    U.TRUNC: P(torch.trunc, recipe("trunc"), "tl.where({x} < 0, tl.ceil({x}), tl.floor({x}))", aten="trunc",
                integer="{x}"),
    U.ERF: P(torch.erf, node("Erf"), "_erf({x})", DtypeRule.FLOAT, aten="erf"),
    U.ERFINV: P(torch.erfinv, declined("ONNX has no Erfinv op"), "libdevice.erfinv({x})", DtypeRule.FLOAT,
                aten="erfinv"),
    U.SIGN: P(torch.sign, recipe("sign"), "tl.where({x} > 0, 1.0, tl.where({x} < 0, -1.0, 0.0))", aten="sign",
               integer="({x} > 0).to({t}) - ({x} < 0).to({t})"),
    U.NOT: P(torch.logical_not, node("Not"), "{x} == 0", DtypeRule.LOGICAL, aten="logical_not"),
    U.BITWISE_NOT: P(torch.bitwise_not, node("BitwiseNot"), None, aten="bitwise_not", integer="~{x}"),
    U.ISINF: P(torch.isinf, node("IsInf"), "tl.abs({x}) > 3.4028234663852886e+38", DtypeRule.PREDICATE, aten="isinf"),
    U.ISNEGINF: P(torch.isneginf, node("IsInf", detect_positive=0), "{x} < -3.4028234663852886e+38",
                  DtypeRule.PREDICATE, aten="isneginf"),
    U.ISPOSINF: P(torch.isposinf, node("IsInf", detect_negative=0), "{x} > 3.4028234663852886e+38",
                  DtypeRule.PREDICATE, aten="isposinf"),
    U.ISNAN: P(torch.isnan, node("IsNaN"), "{x} != {x}", DtypeRule.PREDICATE, aten="isnan"),
    U.ISFINITE: P(torch.isfinite, recipe("isfinite"), "tl.abs({x}) <= 3.4028234663852886e+38", DtypeRule.PREDICATE,
                  aten="isfinite"),
    U.SQUARE: P(torch.square, recipe("square"), "{x} * {x}", DtypeRule.SQUARE, aten="square", integer="{x} * {x}"),
    U.SIGNBIT: P(torch.signbit, _no_onnx("sign bit (-0.0 and -NaN)"), None, DtypeRule.PREDICATE, aten="signbit"),
    **{op: P(fn, _no_onnx(aten.removeprefix("special_")), None, DtypeRule.FLOAT, aten=aten) for op, (fn, aten) in {
        U.LGAMMA: (torch.lgamma, "lgamma"),
        U.DIGAMMA: (torch.digamma, "digamma"),
        U.ERFC: (torch.erfc, "erfc"),
        U.ERFCX: (torch.special.erfcx, "special_erfcx"),
        U.SINC: (torch.sinc, "sinc"),
        U.I0: (torch.i0, "i0"),
        U.I0E: (torch.special.i0e, "special_i0e"),
        U.I1: (torch.special.i1, "special_i1"),
        U.I1E: (torch.special.i1e, "special_i1e"),
        U.NDTR: (torch.special.ndtr, "special_ndtr"),
        U.NDTRI: (torch.special.ndtri, "special_ndtri"),
        U.LOG_NDTR: (torch.special.log_ndtr, "special_log_ndtr"),
        U.ENTR: (torch.special.entr, "special_entr"),
        U.AIRY_AI: (torch.special.airy_ai, "special_airy_ai"),
        U.BESSEL_J0: (torch.special.bessel_j0, "special_bessel_j0"),
        U.BESSEL_J1: (torch.special.bessel_j1, "special_bessel_j1"),
        U.BESSEL_Y0: (torch.special.bessel_y0, "special_bessel_y0"),
        U.BESSEL_Y1: (torch.special.bessel_y1, "special_bessel_y1"),
        U.MODIFIED_BESSEL_I0: (torch.special.modified_bessel_i0, "special_modified_bessel_i0"),
        U.MODIFIED_BESSEL_I1: (torch.special.modified_bessel_i1, "special_modified_bessel_i1"),
        U.MODIFIED_BESSEL_K0: (torch.special.modified_bessel_k0, "special_modified_bessel_k0"),
        U.MODIFIED_BESSEL_K1: (torch.special.modified_bessel_k1, "special_modified_bessel_k1"),
        U.SCALED_MODIFIED_BESSEL_K0: (torch.special.scaled_modified_bessel_k0, "special_scaled_modified_bessel_k0"),
        U.SCALED_MODIFIED_BESSEL_K1: (torch.special.scaled_modified_bessel_k1, "special_scaled_modified_bessel_k1"),
        U.SPHERICAL_BESSEL_J0: (torch.special.spherical_bessel_j0, "special_spherical_bessel_j0"),
    }.items()},
}

# alpha and beta are the layer's parameters (see ActivationType); every activation keeps its input's dtype.
ACTIVATION: dict[L.ActivationType, PointwiseOp] = {
    A.RELU: P(lambda x, a, b: torch.relu(x), node("Relu"),  # one NaN-keeping max, not a compare and a select
              "tl.maximum({x}, 0.0, propagate_nan=tl.PropagateNan.ALL)", aten="relu",
              integer="tl.maximum({x}, tl.full([1], 0, {t}))"),
    A.SIGMOID: P(lambda x, a, b: torch.sigmoid(x), node("Sigmoid"), "{div}(1.0, 1.0 + tl.exp(-{x}))",
                 aten="sigmoid"),
    A.TANH: P(lambda x, a, b: torch.tanh(x), node("Tanh"), "libdevice.tanh({x})", aten="tanh"),
    A.LEAKY_RELU: P(lambda x, a, b: F.leaky_relu(x, a), node("LeakyRelu", alpha="alpha"),
                    "tl.where({x} > 0, {x}, {x} * {alpha})"),
    A.ELU: P(lambda x, a, b: F.elu(x, a), node("Elu", alpha="alpha"),  # the meaning uses alpha only
             "tl.where({x} > 0, {x}, {alpha} * libdevice.expm1({x}))"),
    A.SELU: P(lambda x, a, b: F.selu(x), node("Selu"),  # ONNX's default alpha and gamma are torch's
              f"{_SELU_SCALE!r} * tl.where({{x}} > 0, {{x}}, {_SELU_ALPHA!r} * libdevice.expm1({{x}}))", aten="selu"),
    A.CELU: P(lambda x, a, b: F.celu(x, a), node("Celu", alpha="alpha"),
              "tl.where({x} > 0, {x}, {alpha} * libdevice.expm1({div}({x}, {alpha})))"),
    A.SOFTSIGN: P(lambda x, a, b: F.softsign(x), node("Softsign"), "{div}({x}, 1.0 + tl.abs({x}))"),
    A.SOFTPLUS: P(lambda x, a, b: F.softplus(x, a, b), recipe("softplus"),  # alpha: beta, beta: threshold
                  "tl.where({x} * {alpha} > {beta}, {x}, {div}(libdevice.log1p(tl.exp({x} * {alpha})), {alpha}))"),
    A.CLIP: P(lambda x, a, b: _clip(x, a, b), recipe("clip"), _CLAMP, integer=_INT_CLAMP),
    A.HARD_SIGMOID: P(lambda x, a, b: F.hardsigmoid(x), node("HardSigmoid", alpha=1.0 / 6.0, beta=0.5),
                      f"tl.where({{x}} != {{x}}, {{x}}, {_RELU6_OVER_6})", aten="hardsigmoid"),
    A.HARD_SWISH: P(lambda x, a, b: F.hardswish(x), node("HardSwish"), f"{{x}} * {_RELU6_OVER_6}", aten="hardswish"),
    A.HARD_TANH: P(lambda x, a, b: F.hardtanh(x, a, b), recipe("clip"), _CLAMP, integer=_INT_CLAMP),
    A.THRESHOLDED_RELU: P(lambda x, a, b: F.threshold(x, a, b), recipe("threshold"),
                          "tl.where({x} <= {alpha}, {beta}, {x})"),
    A.GELU_ERF: P(lambda x, a, b: F.gelu(x), node("Gelu"), "0.5 * {x} * (1.0 + _erf({x} * 0.7071067811865476))"),
    A.GELU_TANH: P(lambda x, a, b: F.gelu(x, approximate="tanh"), node("Gelu", approximate="tanh"),
                   "0.5 * {x} * (1.0 + libdevice.tanh(0.7978845608028654 * ({x} + 0.044715 * {x} * {x} * {x})))"),
    A.SILU: P(lambda x, a, b: F.silu(x), recipe("silu"), "{div}({x}, 1.0 + tl.exp(-{x}))", aten="silu"),
    A.MISH: P(lambda x, a, b: F.mish(x), node("Mish"), "{x} * libdevice.tanh(libdevice.log1p(tl.exp({x})))",
              aten="mish"),
    A.LOG_SIGMOID: P(lambda x, a, b: F.logsigmoid(x), recipe("log_sigmoid"),
                     "tl.minimum({x}, 0.0) - libdevice.log1p(tl.exp(-tl.abs({x})))", aten="log_sigmoid"),
    A.POLYGAMMA: P(lambda x, a, b: torch.polygamma(int(a), x), _no_onnx("polygamma"), None),
    A.MVLGAMMA: P(lambda x, a, b: torch.mvlgamma(x, int(a)), _no_onnx("mvlgamma"), None),
}

FAMILIES: dict[type[L.Layer], tuple[type[enum.Enum], dict]] = {
    L.ElementWiseLayer: (L.ElementWiseOperation, ELEMENTWISE),
    L.UnaryLayer: (L.UnaryOperation, UNARY),
    L.ActivationLayer: (L.ActivationType, ACTIVATION),
}


def row(layer: L.Layer) -> PointwiseOp:
    """The table row of an elementwise, unary or activation layer."""
    if isinstance(layer, L.ActivationLayer):
        return ACTIVATION[layer.type]
    return (ELEMENTWISE if isinstance(layer, L.ElementWiseLayer) else UNARY)[layer.op]
