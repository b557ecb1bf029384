"""Pointwise layers: elementwise (binary), unary, activation, parametric ReLU, scale."""
from __future__ import annotations

import math
from collections.abc import Callable

import torch

from torchkiln.ir import layers as L
from torchkiln.onnx_export.context import ExportContext, dtype_name, exporter, promoted

E = L.ElementWiseOperation
U = L.UnaryOperation
A = L.ActivationType


def _trunc(ctx: ExportContext, x: str, dtype: torch.dtype) -> str:
    """Round toward zero (ONNX has no Trunc): ceil below zero, floor elsewhere (NaN stays NaN)."""
    negative = ctx.op("Less", [x, ctx.scalar(0, dtype)], dtype, typed_outputs=())
    return ctx.op("Where", [negative, ctx.op("Ceil", [x], dtype), ctx.op("Floor", [x], dtype)], dtype, typed=(1, 2))


def _is(ctx: ExportContext, op_type: str, x: str, value: float, dtype: torch.dtype) -> str:
    """A bool tensor: x <op_type> value."""
    return ctx.op(op_type, [x, ctx.scalar(value, dtype)], dtype, typed_outputs=())


def _float_floor_div(ctx: ExportContext, a: str, b: str, dtype: torch.dtype) -> str:
    """torch's floor division of floats, step by step as ATen computes it (fmod, exact quotient, correction)."""
    mod = ctx.op("Mod", [a, b], dtype, fmod=1)
    div = ctx.op("Div", [ctx.op("Sub", [a, mod], dtype), b], dtype)
    wrong_sign = ctx.node("Xor", [_is(ctx, "Less", b, 0, dtype), _is(ctx, "Less", mod, 0, dtype)])[0]
    nonzero = ctx.node("Not", [_is(ctx, "Equal", mod, 0, dtype)])[0]
    fix = ctx.node("And", [nonzero, wrong_sign])[0]
    div = ctx.op("Sub", [div, ctx.cast(fix, torch.bool, dtype)], dtype)
    floor = ctx.op("Floor", [div], dtype)
    round_up = _is(ctx, "Greater", ctx.op("Sub", [div, floor], dtype), 0.5, dtype)
    floor = ctx.op("Add", [floor, ctx.cast(round_up, torch.bool, dtype)], dtype)
    by_zero = _is(ctx, "Equal", b, 0, dtype)
    return ctx.op("Where", [by_zero, ctx.op("Div", [a, b], dtype), floor], dtype, typed=(1, 2))


def _int_floor_div(ctx: ExportContext, a: str, b: str, dtype: torch.dtype) -> str:
    """Integer floor division: the truncated quotient, one less where the remainder's sign differs from b's."""
    q = ctx.op("Div", [a, b], dtype)
    r = ctx.op("Sub", [a, ctx.op("Mul", [q, b], dtype)], dtype)
    wrong_sign = ctx.node("Xor", [_is(ctx, "Less", r, 0, dtype), _is(ctx, "Less", b, 0, dtype)])[0]
    fix = ctx.node("And", [ctx.node("Not", [_is(ctx, "Equal", r, 0, dtype)])[0], wrong_sign])[0]
    return ctx.op("Sub", [q, ctx.cast(fix, torch.bool, dtype)], dtype)


def _float_remainder(ctx: ExportContext, a: str, b: str, dtype: torch.dtype) -> str:
    """torch.remainder of floats: fmod, plus b where the result's sign differs from b's."""
    mod = ctx.op("Mod", [a, b], dtype, fmod=1)
    wrong_sign = ctx.node("Xor", [_is(ctx, "Less", b, 0, dtype), _is(ctx, "Less", mod, 0, dtype)])[0]
    fix = ctx.node("And", [ctx.node("Not", [_is(ctx, "Equal", mod, 0, dtype)])[0], wrong_sign])[0]
    return ctx.op("Where", [fix, ctx.op("Add", [mod, b], dtype), mod], dtype, typed=(1, 2))


_ARITHMETIC = {E.SUM: "Add", E.PROD: "Mul", E.SUB: "Sub", E.DIV: "Div", E.MAX: "Max", E.MIN: "Min", E.POW: "Pow"}
_COMPARE = {E.EQUAL: "Equal", E.GREATER: "Greater", E.GREATER_EQUAL: "GreaterOrEqual", E.LESS: "Less",
            E.LESS_EQUAL: "LessOrEqual"}
_LOGICAL = {E.AND: "And", E.OR: "Or", E.XOR: "Xor"}
_BITWISE = {E.BITWISE_AND: ("BitwiseAnd", "And"), E.BITWISE_OR: ("BitwiseOr", "Or"),
            E.BITWISE_XOR: ("BitwiseXor", "Xor")}


@exporter(L.ElementWiseLayer)
def _elementwise(ctx: ExportContext, layer: L.ElementWiseLayer, xs: list[str]) -> str:
    op, out = layer.op, layer.outputs[0].dtype
    (ta, tb), (a, b) = layer.inputs, xs
    if op in _LOGICAL:
        return ctx.node(_LOGICAL[op], [ctx.cast(a, ta.dtype, torch.bool), ctx.cast(b, tb.dtype, torch.bool)])[0]
    if op in _COMPARE or op == E.NOT_EQUAL:
        dtype = promoted(ta, tb)
        a, b = ctx.cast(a, ta.dtype, dtype), ctx.cast(b, tb.dtype, dtype)
        equal = ctx.op(_COMPARE.get(op, "Equal"), [a, b], dtype, typed_outputs=())
        return ctx.node("Not", [equal])[0] if op == E.NOT_EQUAL else equal
    a, b = ctx.cast(a, ta.dtype, out), ctx.cast(b, tb.dtype, out)
    if op in _ARITHMETIC:
        return ctx.op(_ARITHMETIC[op], [a, b], out)
    if op in _BITWISE:
        bitwise, logical = _BITWISE[op]
        return ctx.node(logical, [a, b])[0] if out == torch.bool else ctx.op(bitwise, [a, b], out)
    if op == E.FMOD:
        return ctx.op("Mod", [a, b], out, fmod=1)
    if op == E.REMAINDER:
        return _float_remainder(ctx, a, b, out) if out.is_floating_point else ctx.op("Mod", [a, b], out, fmod=0)
    if op == E.TRUNC_DIV:
        return _trunc(ctx, ctx.op("Div", [a, b], out), out) if out.is_floating_point else ctx.op("Div", [a, b], out)
    if op == E.FLOOR_DIV:
        return (_float_floor_div if out.is_floating_point else _int_floor_div)(ctx, a, b, out)
    ctx.decline(f"op={op.name}: ONNX has no {op.value} op, and composing one would not be exact at its "
                f"edges (signed zeros, infinities)")


def _single(op_type: str) -> Callable[[ExportContext, str, torch.dtype], str]:
    return lambda ctx, x, dt: ctx.op(op_type, [x], dt)


def _log_base(base: float) -> Callable[[ExportContext, str, torch.dtype], str]:
    return lambda ctx, x, dt: ctx.op("Div", [ctx.op("Log", [x], dt), ctx.scalar(math.log(base), dt)], dt)


def _is_finite(ctx: ExportContext, x: str, dt: torch.dtype) -> str:
    inf, nan = ctx.op("IsInf", [x], dt, typed_outputs=()), ctx.op("IsNaN", [x], dt, typed_outputs=())
    return ctx.node("Not", [ctx.node("Or", [inf, nan])[0]])[0]


def _sign(ctx: ExportContext, x: str, dt: torch.dtype) -> str:
    """torch.sign: ONNX's Sign, but 0 for NaN (ONNX Runtime gives NaN)."""
    if not dt.is_floating_point:
        return ctx.op("Sign", [x], dt)
    nan = ctx.op("IsNaN", [x], dt, typed_outputs=())
    return ctx.op("Where", [nan, ctx.scalar(0, dt), ctx.op("Sign", [x], dt)], dt, typed=(1, 2))


# Unary ops on a float input of dtype `dt` (ints are cast to the output's float dtype first, as torch does).
_UNARY: dict[L.UnaryOperation, Callable[[ExportContext, str, torch.dtype], str]] = {
    U.EXP: _single("Exp"),
    U.EXPM1: lambda ctx, x, dt: ctx.op("Sub", [ctx.op("Exp", [x], dt), ctx.scalar(1, dt)], dt),
    U.LOG: _single("Log"),
    U.LOG2: _log_base(2.0),
    U.LOG10: _log_base(10.0),
    U.LOG1P: lambda ctx, x, dt: ctx.op("Log", [ctx.op("Add", [x, ctx.scalar(1, dt)], dt)], dt),
    U.SQRT: _single("Sqrt"),
    U.RSQRT: lambda ctx, x, dt: ctx.op("Reciprocal", [ctx.op("Sqrt", [x], dt)], dt),
    U.RECIP: _single("Reciprocal"),
    U.ABS: _single("Abs"),
    U.NEG: _single("Neg"),
    U.SIN: _single("Sin"), U.COS: _single("Cos"), U.TAN: _single("Tan"),
    U.SINH: _single("Sinh"), U.COSH: _single("Cosh"),
    U.ASIN: _single("Asin"), U.ACOS: _single("Acos"), U.ATAN: _single("Atan"),
    U.ASINH: _single("Asinh"), U.ACOSH: _single("Acosh"), U.ATANH: _single("Atanh"),
    U.CEIL: _single("Ceil"), U.FLOOR: _single("Floor"), U.ROUND: _single("Round"),
    U.TRUNC: _trunc,
    U.ERF: _single("Erf"),
    U.SIGN: lambda ctx, x, dt: _sign(ctx, x, dt),
    U.ISINF: lambda ctx, x, dt: ctx.op("IsInf", [x], dt, typed_outputs=()),
    U.ISNAN: lambda ctx, x, dt: ctx.op("IsNaN", [x], dt, typed_outputs=()),
    U.ISFINITE: _is_finite,
    U.SQUARE: lambda ctx, x, dt: ctx.op("Mul", [x, x], dt),
}
_INTEGER_IDENTITY = (U.CEIL, U.FLOOR, U.ROUND, U.TRUNC)  # torch returns integers unchanged
_INTEGER_NATIVE = (U.ABS, U.NEG, U.SIGN, U.SQUARE)


@exporter(L.UnaryLayer)
def _unary(ctx: ExportContext, layer: L.UnaryLayer, xs: list[str]) -> str:
    op, src, out = layer.op, layer.inputs[0].dtype, layer.outputs[0].dtype
    x = xs[0]
    if op == U.NOT or (op == U.BITWISE_NOT and src == torch.bool):
        return ctx.node("Not", [ctx.cast(x, src, torch.bool)])[0]
    if op == U.BITWISE_NOT:
        return ctx.op("BitwiseNot", [x], src)
    if op in (U.ISINF, U.ISNAN, U.ISFINITE):  # integers are finite: test them as float32, exactly
        dt = src if src.is_floating_point else torch.float32
        return _UNARY[op](ctx, ctx.cast(x, src, dt), dt)
    if not src.is_floating_point and op in _INTEGER_IDENTITY:
        return ctx.node("Identity", [x])[0]
    if not out.is_floating_point and op not in _INTEGER_NATIVE:
        ctx.decline(f"op={op.name} on {dtype_name(src)} gives {dtype_name(out)}, which has no ONNX form here")
    return _UNARY[op](ctx, ctx.cast(x, src, out), out)


def _softplus(ctx: ExportContext, x: str, dt: torch.dtype, beta: float, threshold: float) -> str:
    """torch's softplus: x where beta * x > threshold, else log(1 + exp(beta * x)) / beta."""
    bx = ctx.op("Mul", [x, ctx.scalar(beta, dt)], dt)
    soft = ctx.op("Div", [ctx.op("Softplus", [bx], dt), ctx.scalar(beta, dt)], dt)
    return ctx.op("Where", [_is(ctx, "Greater", bx, threshold, dt), x, soft], dt, typed=(1, 2))


def _clip(ctx: ExportContext, x: str, dt: torch.dtype, lo: float, hi: float) -> str:
    """torch.clamp: Clip between finite bounds; Max or Min for one (ORT's Clip would turn inf into the
    dtype's largest finite value)."""
    if not math.isinf(lo) and not math.isinf(hi):
        return ctx.op("Clip", [x, ctx.scalar(lo, dt), ctx.scalar(hi, dt)], dt)
    if not math.isinf(lo):
        x = ctx.op("Max", [x, ctx.scalar(lo, dt)], dt)
    if not math.isinf(hi):
        x = ctx.op("Min", [x, ctx.scalar(hi, dt)], dt)
    return x


def _threshold(ctx: ExportContext, x: str, dt: torch.dtype, threshold: float, value: float) -> str:
    """torch.threshold: value where x <= threshold, else x (NaN stays NaN)."""
    return ctx.op("Where", [_is(ctx, "LessOrEqual", x, threshold, dt), ctx.scalar(value, dt), x], dt, typed=(1, 2))


_ACTIVATIONS: dict[L.ActivationType, Callable[[ExportContext, str, torch.dtype, float, float], str]] = {
    A.RELU: lambda ctx, x, dt, a, b: ctx.op("Relu", [x], dt),
    A.SIGMOID: lambda ctx, x, dt, a, b: ctx.op("Sigmoid", [x], dt),
    A.TANH: lambda ctx, x, dt, a, b: ctx.op("Tanh", [x], dt),
    A.LEAKY_RELU: lambda ctx, x, dt, a, b: ctx.op("LeakyRelu", [x], dt, alpha=a),
    A.ELU: lambda ctx, x, dt, a, b: ctx.op("Elu", [x], dt, alpha=a),  # the meaning uses alpha only
    A.SELU: lambda ctx, x, dt, a, b: ctx.op("Selu", [x], dt),  # ONNX's default alpha and gamma are torch's
    A.CELU: lambda ctx, x, dt, a, b: ctx.op("Celu", [x], dt, alpha=a),
    A.SOFTSIGN: lambda ctx, x, dt, a, b: ctx.op("Softsign", [x], dt),
    A.SOFTPLUS: _softplus,
    A.CLIP: _clip,
    A.HARD_SIGMOID: lambda ctx, x, dt, a, b: ctx.op("HardSigmoid", [x], dt, alpha=1.0 / 6.0, beta=0.5),
    A.HARD_SWISH: lambda ctx, x, dt, a, b: ctx.op("HardSwish", [x], dt),
    A.HARD_TANH: _clip,
    A.THRESHOLDED_RELU: _threshold,
    A.GELU_ERF: lambda ctx, x, dt, a, b: ctx.op("Gelu", [x], dt),
    A.GELU_TANH: lambda ctx, x, dt, a, b: ctx.op("Gelu", [x], dt, approximate="tanh"),
    A.SILU: lambda ctx, x, dt, a, b: ctx.op("Mul", [x, ctx.op("Sigmoid", [x], dt)], dt),
    A.MISH: lambda ctx, x, dt, a, b: ctx.op("Mish", [x], dt),
    A.LOG_SIGMOID: lambda ctx, x, dt, a, b: ctx.op("Neg", [ctx.op("Softplus", [ctx.op("Neg", [x], dt)], dt)], dt),
}


@exporter(L.ActivationLayer)
def _activation(ctx: ExportContext, layer: L.ActivationLayer, xs: list[str]) -> str:
    src, out = layer.inputs[0].dtype, layer.outputs[0].dtype
    if not out.is_floating_point and layer.type != A.CLIP:
        ctx.decline(f"type={layer.type.name} on {dtype_name(src)}: only float inputs are exported")
    return _ACTIVATIONS[layer.type](ctx, ctx.cast(xs[0], src, out), out, layer.alpha, layer.beta)


@exporter(L.ParametricReLULayer)
def _prelu(ctx: ExportContext, layer: L.ParametricReLULayer, xs: list[str]) -> str:
    x, dt = layer.inputs[0], layer.outputs[0].dtype
    slope = layer.weights["slope"]
    if slope.numel() > 1:  # one slope per channel (dim 1): align it with dim 1 for ONNX's trailing broadcast
        slope = slope.reshape([-1] + [1] * (x.rank - 2))
    return ctx.op("PRelu", [xs[0], ctx.constant(slope.to(dt), "slope")], dt)


@exporter(L.ScaleLayer)
def _scale(ctx: ExportContext, layer: L.ScaleLayer, xs: list[str]) -> str:
    x, (value,), dt = layer.inputs[0], xs, layer.inputs[0].dtype
    for weight, op_type in (("scale", "Mul"), ("shift", "Add"), ("power", "Pow")):
        w = layer.weights.get(weight)
        if w is None:
            continue
        if layer.mode == L.ScaleMode.CHANNEL:
            w = w.reshape([-1] + [1] * (x.rank - layer.channel_axis % x.rank - 1))
        new = torch.result_type(torch.empty((1,) * x.rank, dtype=dt, device="meta"), w.to("meta"))
        value = ctx.op(op_type, [ctx.cast(value, dt, new), ctx.constant(w.to(new), weight)], new)
        dt = new
    return ctx.cast(value, dt, layer.outputs[0].dtype)
