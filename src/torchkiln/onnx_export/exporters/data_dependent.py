"""Layers whose output size depends on the data (nonzero, unique): ONNX's NonZero and Unique, whose outputs ONNX
Runtime sizes when they run. Each defines its symbol from its first output's dim 0, for the layers after it."""
from __future__ import annotations

from torchkiln.ir import layers as L
from torchkiln.onnx_export.context import ExportContext, exporter


@exporter(L.NonZeroLayer)
def _non_zero(ctx: ExportContext, layer: L.NonZeroLayer, xs: list[str]) -> str:
    x = layer.inputs[0]
    flat = xs[0] if x.rank else ctx.node("Reshape", [xs[0], ctx.ints([1], "shape")])[0]
    rows = ctx.op("NonZero", [flat], x.dtype, typed_outputs=())  # int64 [rank, count]
    out = ctx.node("Transpose", [rows], perm=[1, 0])[0]
    if not x.rank:  # torch: [count, 0] for a 0-d input (ONNX Runtime: [1, count] of it read as [1])
        zero = ctx.ints([0], "zero")
        out = ctx.node("Slice", [out, zero, zero, ctx.ints([1], "axes")])[0]
    ctx.define_symbol(layer.count, out, 0)
    return out


@exporter(L.UniqueLayer)
def _unique(ctx: ExportContext, layer: L.UniqueLayer, xs: list[str]) -> list[str]:
    x = layer.inputs[0]
    if layer.consecutive:
        ctx.decline("ONNX's Unique does not keep runs of equal values apart")
    if x.dtype.is_floating_point:
        ctx.decline("ONNX Runtime's Unique keeps the first of 0.0 and -0.0 and tells NaNs apart otherwise than torch")
    values, _, inverse, counts = ctx.op("Unique", [xs[0]], x.dtype, outputs=4, typed_outputs=(0,), sorted=1)
    inverse = ctx.node("Reshape", [inverse, ctx.shape_tensor(x.shape)])[0]
    ctx.define_symbol(layer.count, values, 0)
    return [values, inverse, counts]
