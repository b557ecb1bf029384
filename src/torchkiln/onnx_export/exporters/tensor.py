"""Layers that create, move or pick data: constant, fill, identity, cast, shape, shuffle, slice, concatenation,
expand, gather, scatter, select, padding, topk, dim value. Parameters that are symbolic dims become int64
values computed at run time (`ExportContext.dim`)."""
from __future__ import annotations

import sympy
import torch

from torchkiln.ir import layers as L
from torchkiln.ir.quantization import as_uint8
from torchkiln.ir.reference import run_layer
from torchkiln.ir.symbolic import Dim, decide, dim_str, has_symbols, is_symbolic
from torchkiln.onnx_export.context import ONNX_DTYPES, ExportContext, exporter

_INT64_MIN = -(2 ** 63)


@exporter(L.ConstantLayer)
def _constant(ctx: ExportContext, layer: L.ConstantLayer, xs: list[str]) -> str:
    value = layer.weights["value"]
    if id(layer.outputs[0]) in ctx.unsigned:  # int8 weights written as uint8 (`network_to_onnx(unsigned_weights)`)
        value = as_uint8(value)
    return ctx.constant(value, "value")


@exporter(L.FillLayer)
def _fill(ctx: ExportContext, layer: L.FillLayer, xs: list[str]) -> str:
    """A fill has no inputs: with static parameters its values, computed by its reference meaning, become an
    initializer; with a symbolic length or start, index * step + start as the meaning computes it (float64)."""
    if not has_symbols([layer.length, layer.start]):
        return ctx.constant(run_layer(layer, [], {}, torch.device("cpu"))[0], "fill")
    if has_symbols(layer.step) or not isinstance(layer.step, (int, float)):
        ctx.decline(f"step={layer.step} is not a number")
    index = ctx.node("Range", [ctx.dim_scalar(0), ctx.dim_scalar(layer.length), ctx.dim_scalar(1)])[0]
    value = ctx.node("Mul", [ctx.cast(index, torch.int64, torch.float64), ctx.scalar(layer.step, torch.float64)])[0]
    if is_symbolic(layer.start):
        start = ctx.cast(ctx.dim(layer.start), torch.int64, torch.float64)
    else:
        start = ctx.scalar(layer.start, torch.float64)
    return ctx.cast(ctx.node("Add", [value, start])[0], torch.float64, layer.dtype)


@exporter(L.IdentityLayer)
def _identity(ctx: ExportContext, layer: L.IdentityLayer, xs: list[str]) -> str:
    return ctx.node("Identity", xs)[0]


@exporter(L.CastLayer)
def _cast(ctx: ExportContext, layer: L.CastLayer, xs: list[str]) -> str:
    src, dst = layer.inputs[0].dtype, layer.to_type
    if dst not in ONNX_DTYPES:
        ctx.decline(f"to_type={dst} has no ONNX type")
    return ctx.node("Cast", xs, to=ONNX_DTYPES[dst])[0] if src != dst else ctx.node("Identity", xs)[0]


@exporter(L.ShapeLayer)
def _shape(ctx: ExportContext, layer: L.ShapeLayer, xs: list[str]) -> str:
    return ctx.node("Shape", xs)[0]


@exporter(L.ShuffleLayer)
def _shuffle(ctx: ExportContext, layer: L.ShuffleLayer, xs: list[str]) -> str:
    x = xs[0]
    if layer.first_transpose:  # a 0-d tensor's permutation () moves nothing (and ONNX cannot type perm=[])
        x = ctx.node("Transpose", [x], perm=list(layer.first_transpose))[0]
    if layer.reshape_dims is not None:  # ONNX's allowzero=0 copies the input dim for a 0, like TensorRT's shuffle
        target = _placeholder_target(layer)
        if target is not None:
            x = ctx.node("Reshape", [x, ctx.ints(target, "shape")], allowzero=0)[0]
        else:  # a symbolic dim that is 0 at run time is a placeholder too, as in the meaning (which sees ints)
            allowzero = 0 if layer.zero_is_placeholder else 1
            x = ctx.node("Reshape", [x, ctx.shape_tensor(layer.reshape_dims)], allowzero=allowzero)[0]
    if layer.second_transpose:
        x = ctx.node("Transpose", [x], perm=list(layer.second_transpose))[0]
    return x if x != xs[0] else ctx.node("Identity", [x])[0]


def _placeholder_target(layer: L.ShuffleLayer) -> list[int] | None:
    """A constant Reshape target for symbolic reshape dims, or None: 0 (copy the input dim) where the result dim
    is the input dim at that index, -1 (inferred) for at most one other symbolic dim, ints elsewhere. ONNX
    Runtime's shape inference keeps the symbolic dims through such a Reshape (not through a computed target),
    which its fusions (SkipLayerNormalization, Gemm) need. Only where every result dim is at least 1 over the
    ranges, so neither a run-time 0 nor an empty tensor can make 0 or -1 mean something else."""
    if not has_symbols(layer.reshape_dims):
        return None
    x, out = layer.inputs[0].shape, layer.outputs[0].shape
    if layer.first_transpose is not None:
        x = tuple(x[p] for p in layer.first_transpose)
    result: list[Dim] = list(out)
    if layer.second_transpose is not None:
        for k, p in enumerate(layer.second_transpose):
            result[p] = out[k]
    if any(decide("ge", d, 1) is not True for d in result):
        return None
    target: list[int] = []
    for i, d in enumerate(result):
        if i < len(x) and decide("eq", d, x[i]) is True:
            target.append(0)
        elif is_symbolic(d):
            target.append(-1)
        else:
            target.append(int(d))
    return target if target.count(-1) <= 1 else None


def _symbolic_end(ctx: ExportContext, axis: int, start: Dim, size: Dim, step: int, dim: Dim) -> Dim:
    """The ONNX end of a slice axis with a symbolic start or size. The meaning raises unless the elements taken
    lie in [0, dim); that must follow from the symbols' ranges, else ONNX's clamping could give another shape."""
    last = start + (size - 1) * step
    first_index, last_index = (start, last) if step > 0 else (last, start)
    for what, op, a, b in (("size", "ge", size, 0), ("first index", "ge", first_index, 0),
                           ("last index", "lt", last_index, dim)):
        if decide(op, a, b) is not True:
            ctx.decline(f"axis {axis}: the ranges do not show the slice's {what} in bounds (start {dim_str(start)}, "
                        f"size {dim_str(size)}, stride {step}, dim {dim_str(dim)})")
    # size 0 ends at start; else one past the last element (one before it for a negative stride)
    return start + (sympy.Max(last - start + 1, 0) if step > 0 else sympy.Min(last - start - 1, 0))


@exporter(L.SliceLayer)
def _slice(ctx: ExportContext, layer: L.SliceLayer, xs: list[str]) -> str:
    shape = layer.inputs[0].shape
    starts, ends, axes, steps = [], [], [], []
    symbolic = False
    for axis, (start, size, step) in enumerate(zip(layer.start, layer.shape, layer.stride)):
        if is_symbolic(step):
            ctx.decline(f"stride[{axis}] = {dim_str(step)} is symbolic")
        if start == 0 and step == 1 and size == shape[axis]:
            continue
        if is_symbolic(start) or is_symbolic(size):
            symbolic = True
            end = _symbolic_end(ctx, axis, start, size, step, shape[axis])
        else:
            end = start + (size - 1) * step + (1 if step > 0 else -1) if size else start
            if end < 0:  # a negative end would count from the back: "before index 0" is INT64_MIN
                end = _INT64_MIN
        starts.append(start)
        ends.append(end)
        axes.append(axis)
        steps.append(step)
    if not axes:
        return ctx.node("Identity", xs)[0]
    ends_value = ctx.shape_tensor(ends, "ends")
    if symbolic:  # a run-time end of -1 (a negative stride down to index 0) means "before index 0" too
        negative = ctx.node("Less", [ends_value, ctx.ints([0], "zero")])[0]
        ends_value = ctx.node("Where", [negative, ctx.ints([_INT64_MIN], "before_zero"), ends_value])[0]
    return ctx.node("Slice", [xs[0], ctx.shape_tensor(starts, "starts"), ends_value, ctx.ints(axes, "axes"),
                              ctx.ints(steps, "steps")])[0]


@exporter(L.ConcatenationLayer)
def _concatenation(ctx: ExportContext, layer: L.ConcatenationLayer, xs: list[str]) -> str:
    out = layer.outputs[0].dtype  # torch.cat promotes mixed dtypes
    return ctx.node("Concat", [ctx.cast(x, t.dtype, out) for x, t in zip(xs, layer.inputs)], axis=layer.axis)[0]


@exporter(L.ExpandLayer)
def _expand(ctx: ExportContext, layer: L.ExpandLayer, xs: list[str]) -> str:
    # ONNX's Expand broadcasts both ways, so a 1 keeps the input's dim, as torch's -1 does.
    shape = [1 if d == -1 else d for d in layer.shape]
    return ctx.op("Expand", [xs[0], ctx.shape_tensor(shape)], layer.inputs[0].dtype, typed=(0,))


def _indices(ctx: ExportContext, x: str, dtype: torch.dtype) -> str:
    return x if dtype in (torch.int32, torch.int64) else ctx.cast(x, dtype, torch.int64)


def _never_wrap(ctx: ExportContext, layer: L.GatherLayer, idx: str, dtype: torch.dtype) -> str:
    """ONNX's Gather and GatherND wrap negative indices; a gather layer never does (see its meaning). Indices known
    only at run time have their negative entries replaced by one past any dim, so ONNX Runtime raises instead of
    reading the wrong row (constant indices are checked when the layer is made)."""
    if L.constant_value(layer.inputs[1]) is not None:
        return idx
    negative = ctx.node("Less", [idx, ctx.scalar(0, dtype)])[0]
    return ctx.node("Where", [negative, ctx.scalar(torch.iinfo(dtype).max, dtype), idx])[0]


@exporter(L.GatherLayer)
def _gather(ctx: ExportContext, layer: L.GatherLayer, xs: list[str]) -> str:
    (data, idx), itype = xs, layer.inputs[1].dtype
    if layer.mode == L.GatherMode.ELEMENT:
        return ctx.node("GatherElements", [data, _never_wrap(ctx, layer, _indices(ctx, idx, itype), torch.int64)],
                        axis=layer.axis)[0]
    if layer.mode == L.GatherMode.ND:
        return ctx.node("GatherND", [data, _never_wrap(ctx, layer, ctx.cast(idx, itype, torch.int64), torch.int64)])[0]
    idx = _indices(ctx, idx, itype)
    return ctx.node("Gather", [data, _never_wrap(ctx, layer, idx, itype if itype == torch.int32 else torch.int64)],
                    axis=layer.axis)[0]


@exporter(L.ScatterLayer)
def _scatter(ctx: ExportContext, layer: L.ScatterLayer, xs: list[str]) -> str:
    (data, idx, updates), (_, tidx, tupd) = xs, layer.inputs
    if tidx.rank == 0:
        ctx.decline("0-d index: ONNX's ScatterElements takes tensors of rank 1 and up")
    if tidx.is_dynamic or tupd.is_dynamic:
        layer_dims = [t.shape for t in layer.inputs]
        ctx.decline(f"dynamic dims in {layer_dims}: the updates' slice to the index shape must be static")
    if tupd.shape != tidx.shape:  # torch.scatter reads only the index-shaped corner of src; ONNX needs it exact
        n = tidx.rank
        updates = ctx.node("Slice", [updates, ctx.ints([0] * n, "starts"), ctx.ints(tidx.shape, "ends")])[0]
    return ctx.node("ScatterElements", [data, _indices(ctx, idx, tidx.dtype), updates], axis=layer.axis)[0]


@exporter(L.SelectLayer)
def _select(ctx: ExportContext, layer: L.SelectLayer, xs: list[str]) -> str:
    (cond, a, b), (tc, ta, tb), out = xs, layer.inputs, layer.outputs[0].dtype
    cond = ctx.cast(cond, tc.dtype, torch.bool)
    return ctx.op("Where", [cond, ctx.cast(a, ta.dtype, out), ctx.cast(b, tb.dtype, out)], out, typed=(1, 2))


_PAD_MODES = {L.PaddingMode.CONSTANT: "constant", L.PaddingMode.REFLECT: "reflect",
              L.PaddingMode.REPLICATE: "edge", L.PaddingMode.CIRCULAR: "wrap"}


@exporter(L.PaddingLayer)
def _padding(ctx: ExportContext, layer: L.PaddingLayer, xs: list[str]) -> str:
    if id(layer) in ctx.folded_pads:  # the max pool reading it pads its input itself (`pads_into_max_pools`)
        return xs[0]
    dt, rank = layer.inputs[0].dtype, layer.inputs[0].rank
    begins, ends = [0] * rank, [0] * rank
    for i in range(len(layer.pad) // 2):  # torch's order: last dim first, (begin, end) pairs
        begins[rank - 1 - i], ends[rank - 1 - i] = layer.pad[2 * i], layer.pad[2 * i + 1]
    if layer.mode == L.PaddingMode.REFLECT:
        _check_reflect_pads(ctx, layer.inputs[0].shape, begins, ends)
    inputs = [xs[0], ctx.shape_tensor(begins + ends, "pads")]
    if layer.mode == L.PaddingMode.CONSTANT:
        compute = ctx.compute_dtype("Pad", dt)
        inputs.append(ctx.scalar(torch.tensor(layer.value).to(dt).item(), compute))
        return ctx.cast(ctx.node("Pad", [ctx.cast(xs[0], dt, compute)] + inputs[1:], mode="constant")[0], compute, dt)
    return ctx.op("Pad", inputs, dt, typed=(0,), mode=_PAD_MODES[layer.mode])


def _check_reflect_pads(ctx: ExportContext, shape: tuple[Dim, ...], begins: list[Dim], ends: list[Dim]) -> None:
    """ONNX Runtime crops the negative pads first and reflects what is left, so a positive pad must be below the
    length left (torch measures it against the whole dim)."""
    for axis, (begin, end, n) in enumerate(zip(begins, ends, shape)):
        left = n + sympy.Min(begin, 0) + sympy.Min(end, 0)
        if decide("lt", sympy.Max(begin, end), left) is not True:
            ctx.decline(f"reflect pads ({dim_str(begin)}, {dim_str(end)}) of axis {axis} (size {dim_str(n)}): ONNX "
                        f"Runtime reflects only the {dim_str(left)} elements a negative pad leaves, and refuses a pad "
                        f"of that many or more")


@exporter(L.TopKLayer)
def _topk(ctx: ExportContext, layer: L.TopKLayer, xs: list[str]) -> list[str]:
    # ONNX's TopK puts the lower index first among equal values, as torch.max/min do for k=1.
    dt = layer.inputs[0].dtype
    values, indices = ctx.op("TopK", [xs[0], ctx.dim(layer.k)], dt, typed=(0,), outputs=2, typed_outputs=(0,),
                             axis=layer.axis, largest=int(layer.op == L.TopKOperation.MAX), sorted=1)
    if layer.k != 1 or not dt.is_floating_point:
        return [values, indices]
    # torch.max/min(x, dim) propagate NaN (the value, and the first NaN's index); ONNX Runtime's TopK skips it
    nan = ctx.cast(ctx.op("IsNaN", [xs[0]], dt, typed_outputs=()), torch.bool, torch.int32)
    first = ctx.node("ArgMax", [nan], axis=layer.axis, keepdims=1, select_last_index=0)[0]
    found = ctx.cast(ctx.node("ReduceMax", [nan, ctx.ints([layer.axis], "axes")], keepdims=1)[0], torch.int32,
                     torch.bool)
    return [ctx.op("Where", [found, ctx.scalar(float("nan"), dt), values], dt, typed=(1, 2)),
            ctx.node("Where", [found, first, indices])[0]]


@exporter(L.DimValueLayer)
def _dim_value(ctx: ExportContext, layer: L.DimValueLayer, xs: list[str]) -> str:
    return ctx.cast(ctx.dim_scalar(layer.value), torch.int64, layer.dtype)
