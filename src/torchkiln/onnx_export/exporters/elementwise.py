"""Pointwise layers: elementwise (binary), unary, activation, parametric ReLU, scale."""
from __future__ import annotations

import math
from collections.abc import Callable

import torch

from torchkiln.ir import layers as L, pointwise as P
from torchkiln.onnx_export.context import ExportContext, dtype_name, exporter, never_empty, promoted

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


def _not_equal(ctx: ExportContext, a: str, b: str, dtype: torch.dtype) -> str:
    return ctx.node("Not", [ctx.op("Equal", [a, b], dtype, typed_outputs=())])[0]


def _remainder(ctx: ExportContext, a: str, b: str, dtype: torch.dtype) -> str:
    return _float_remainder(ctx, a, b, dtype) if dtype.is_floating_point else ctx.op("Mod", [a, b], dtype, fmod=0)


def _trunc_div(ctx: ExportContext, a: str, b: str, dtype: torch.dtype) -> str:
    quotient = ctx.op("Div", [a, b], dtype)
    return _trunc(ctx, quotient, dtype) if dtype.is_floating_point else quotient


def _floor_div(ctx: ExportContext, a: str, b: str, dtype: torch.dtype) -> str:
    return (_float_floor_div if dtype.is_floating_point else _int_floor_div)(ctx, a, b, dtype)


# The compositions the binary table's ONNX slots name, on operands already in `dtype`.
_BINARY_RECIPES: dict[str, Callable[[ExportContext, str, str, torch.dtype], str]] = {
    "not_equal": _not_equal, "remainder": _remainder, "trunc_div": _trunc_div, "floor_div": _floor_div,
}


def _attrs(form: P.Onnx, layer: L.Layer) -> dict[str, object]:
    """A node's attributes; "alpha" and "beta" read the layer's parameters."""
    return {k: getattr(layer, v) if v in ("alpha", "beta") else v for k, v in form.attrs}


def _declined(ctx: ExportContext, what: str, form: P.Onnx) -> None:
    if form.declined:
        ctx.decline(f"{what}: {form.declined}")


@exporter(L.ElementWiseLayer)
def _elementwise(ctx: ExportContext, layer: L.ElementWiseLayer, xs: list[str]) -> str:
    op, out = layer.op, layer.outputs[0].dtype
    (ta, tb), (a, b) = layer.inputs, xs
    row = P.ELEMENTWISE[op]
    form = row.onnx
    _declined(ctx, f"op={op.name}", form)
    if row.dtype == P.DtypeRule.LOGICAL:
        return ctx.node(form.op_type, [ctx.cast(a, ta.dtype, torch.bool), ctx.cast(b, tb.dtype, torch.bool)])[0]
    if row.dtype == P.DtypeRule.COMPARE:
        dtype = promoted(ta, tb)
        a, b = ctx.cast(a, ta.dtype, dtype), ctx.cast(b, tb.dtype, dtype)
        if form.recipe:
            return _BINARY_RECIPES[form.recipe](ctx, a, b, dtype)
        return ctx.op(form.op_type, [a, b], dtype, typed_outputs=())
    a, b = ctx.cast(a, ta.dtype, out), ctx.cast(b, tb.dtype, out)
    if form.recipe:
        return _BINARY_RECIPES[form.recipe](ctx, a, b, out)
    if form.op_type.startswith("Bitwise") and out == torch.bool:  # bitwise ops of bools are the logical ones
        return ctx.node(form.op_type.removeprefix("Bitwise"), [a, b])[0]
    return ctx.op(form.op_type, [a, b], out, **_attrs(form, layer))


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


# The compositions the unary table's ONNX slots name, on an input of dtype `dt` (ints are cast to the output's
# float dtype first, as torch does).
_UNARY_RECIPES: dict[str, Callable[[ExportContext, str, torch.dtype], str]] = {
    "expm1": lambda ctx, x, dt: ctx.op("Sub", [ctx.op("Exp", [x], dt), ctx.scalar(1, dt)], dt),
    "log2": _log_base(2.0),
    "log10": _log_base(10.0),
    "log1p": lambda ctx, x, dt: ctx.op("Log", [ctx.op("Add", [x, ctx.scalar(1, dt)], dt)], dt),
    "rsqrt": lambda ctx, x, dt: ctx.op("Reciprocal", [ctx.op("Sqrt", [x], dt)], dt),
    "trunc": _trunc,
    "sign": _sign,
    "isfinite": _is_finite,
    "square": lambda ctx, x, dt: ctx.op("Mul", [x, x], dt),
}
_INTEGER_IDENTITY = (U.CEIL, U.FLOOR, U.ROUND, U.TRUNC)  # torch returns integers unchanged


@exporter(L.UnaryLayer)
def _unary(ctx: ExportContext, layer: L.UnaryLayer, xs: list[str]) -> str:
    op, src, out = layer.op, layer.inputs[0].dtype, layer.outputs[0].dtype
    x, row = xs[0], P.UNARY[layer.op]
    form = row.onnx
    _declined(ctx, f"op={op.name}", form)
    if row.dtype == P.DtypeRule.LOGICAL or (form.op_type == "BitwiseNot" and src == torch.bool):
        return ctx.node("Not", [ctx.cast(x, src, torch.bool)])[0]
    if form.op_type == "BitwiseNot":
        return ctx.op("BitwiseNot", [x], src)
    if row.dtype == P.DtypeRule.PREDICATE:  # integers are finite: test them as float32, exactly
        dt = src if src.is_floating_point else torch.float32
        x = ctx.cast(x, src, dt)
        return _UNARY_RECIPES[form.recipe](ctx, x, dt) if form.recipe else ctx.op(form.op_type, [x], dt,
                                                                                  typed_outputs=(), **dict(form.attrs))
    if not src.is_floating_point and op in _INTEGER_IDENTITY:
        return ctx.node("Identity", [x])[0]
    if not out.is_floating_point and row.dtype not in (P.DtypeRule.SAME, P.DtypeRule.SQUARE):
        ctx.decline(f"op={op.name} on {dtype_name(src)} gives {dtype_name(out)}, which has no ONNX form here")
    x = ctx.cast(x, src, out)
    return _UNARY_RECIPES[form.recipe](ctx, x, out) if form.recipe else ctx.op(form.op_type, [x], out)


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


# Where ONNX Runtime's sessions compute a float32 SiLU as x * Sigmoid(x) (one QuickGelu node after its fusion): its
# error is at most 2.9e-6 absolute for x < 0 (largest below -8, where the Sigmoid loses its relative precision) and
# 2e-7 relative for x > 0 (ORT 1.32, measured over 34 M points in [-200, 200]), so within 3e-5 of the output's
# largest |value| (a third of the 1e-4 that fp32 results are held to) wherever that largest value is at least this.
SILU_FLOOR = 0.1


def _silu(ctx: ExportContext, x: str, dt: torch.dtype, alpha: float, beta: float) -> str:
    """In a guarded float32 model (ONNX Runtime's sessions), x * Sigmoid(x), which ORT runs as one QuickGelu node, with
    a guard that hands a call whose largest output is under `SILU_FLOOR` to the reference (there the Sigmoid's
    absolute error would be a large part of the output); elsewhere x / (1 + exp(-x)), torch's formula, in four nodes
    (and the NCHWc layout's reorders around the three that have none): exact, and 1.26x the time of the same graph
    with QuickGelu for a SiLU network of 25 such activations between convolutions, at batch 1 on 2 threads (29.2
    against 23.3 ms)."""
    shape = ctx.layer.outputs[0].shape
    if ctx.guard_reachable and dt == torch.float32 and shape and never_empty(shape):
        y = ctx.op("Mul", [x, ctx.op("Sigmoid", [x], dt)], dt)
        ctx.exact_while_largest_at_least(y, dt, shape, SILU_FLOOR)
        return y
    denominator = ctx.op("Add", [ctx.scalar(1, dt), ctx.op("Exp", [ctx.op("Neg", [x], dt)], dt)], dt)
    return ctx.op("Div", [x, denominator], dt)


def _log_sigmoid(ctx: ExportContext, x: str, dt: torch.dtype, alpha: float, beta: float) -> str:
    return ctx.op("Neg", [ctx.op("Softplus", [ctx.op("Neg", [x], dt)], dt)], dt)


# The compositions the activation table's ONNX slots name.
_ACTIVATION_RECIPES: dict[str, Callable[[ExportContext, str, torch.dtype, float, float], str]] = {
    "softplus": _softplus, "clip": _clip, "threshold": _threshold, "silu": _silu, "log_sigmoid": _log_sigmoid,
}


@exporter(L.ActivationLayer)
def _activation(ctx: ExportContext, layer: L.ActivationLayer, xs: list[str]) -> str:
    src, out = layer.inputs[0].dtype, layer.outputs[0].dtype
    form = P.ACTIVATION[layer.type].onnx
    _declined(ctx, f"type={layer.type.name}", form)
    if not out.is_floating_point and layer.type != A.CLIP:
        ctx.decline(f"type={layer.type.name} on {dtype_name(src)}: only float inputs are exported")
    x = ctx.cast(xs[0], src, out)
    if form.recipe:
        return _ACTIVATION_RECIPES[form.recipe](ctx, x, out, layer.alpha, layer.beta)
    return ctx.op(form.op_type, [x], out, **_attrs(form, layer))


@exporter(L.ParametricReLULayer)
def _prelu(ctx: ExportContext, layer: L.ParametricReLULayer, xs: list[str]) -> str:
    x, dt = layer.inputs[0], layer.outputs[0].dtype
    slope = layer.weights["slope"]
    if slope.numel() > 1:  # one slope per channel (dim 1): align it with dim 1 for ONNX's trailing broadcast
        slope = slope.reshape([-1] + [1] * (x.rank - 2))
    else:  # one shared slope: 0-d, so that it broadcasts to any input, a 0-d one included
        slope = slope.reshape([])
    return ctx.op("PRelu", [xs[0], ctx.constant(slope.to(dt), "slope")], dt)


def _channel_affine(layer: L.ScaleLayer) -> bool:
    """Whether `layer` is x * scale + shift per channel of a float32 image (NCHW, static channels), no power."""
    x, weights = layer.inputs[0], layer.weights
    return layer.mode == L.ScaleMode.CHANNEL and x.rank == 4 and layer.channel_axis % 4 == 1 \
        and isinstance(x.shape[1], int) and "power" not in weights and bool(weights) \
        and x.dtype == layer.outputs[0].dtype == torch.float32 \
        and all(w.dtype == torch.float32 for w in weights.values())


def _as_batch_norm(ctx: ExportContext, layer: L.ScaleLayer, x: str) -> str:
    """A per-channel x * scale + shift as BatchNormalization of mean 0, variance 1 and epsilon 0 (its values: the
    normalization divides by sqrt(1 + 0), exactly 1). ONNX Runtime runs it in the NCHWc layout of the convolutions
    around it, as a depthwise convolution with the ReLU after it fused; as Mul and Add (pre-activation batch norms
    after each concatenation of a densely connected CNN) it ran the Add and the ReLU in NCHW, with a reorder on either
    side: such a 121-layer CNN at batch 1 took 1.15x the time of torch.onnx.export's graph, which writes
    BatchNormalization."""
    channels = layer.inputs[0].shape[1]

    def per_channel(name: str, fill: float) -> str:
        w = layer.weights.get(name)
        value = torch.full((channels,), fill) if w is None else w.reshape(-1).expand(channels).contiguous()
        return ctx.constant(value, name)

    stats = [ctx.constant(torch.zeros(channels), "mean"), ctx.constant(torch.ones(channels), "variance")]
    return ctx.op("BatchNormalization", [x, per_channel("scale", 1.0), per_channel("shift", 0.0), *stats],
                  torch.float32, epsilon=0.0)


@exporter(L.ScaleLayer)
def _scale(ctx: ExportContext, layer: L.ScaleLayer, xs: list[str]) -> str:
    x, (value,), dt = layer.inputs[0], xs, layer.inputs[0].dtype
    if _channel_affine(layer):
        return _as_batch_norm(ctx, layer, value)
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
