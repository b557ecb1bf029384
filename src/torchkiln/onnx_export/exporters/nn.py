"""Layers with windows, contractions and normalizations: convolution, pooling, matrix multiply, reduce, softmax,
normalization, einsum, cumulative, resize, grid sample, attention."""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from torchkiln.ir import layers as L
from torchkiln.ir.network import Network
from torchkiln.ir.quantization import per_tensor_int8
from torchkiln.ir.symbolic import bounds, decide, has_symbols, is_symbolic
from torchkiln.ir.tensor import Tensor
from torchkiln.onnx_export.context import ExportContext, dtype_name, exporter
from torchkiln.onnx_export.exporters.quantize import integer_matrix_multiply, quantized_kernel


@exporter(L.ConvolutionLayer)
def _convolution(ctx: ExportContext, layer: L.ConvolutionLayer, xs: list[str]) -> str:
    dt = layer.inputs[0].dtype
    op_type = "ConvTranspose" if layer.transposed else "Conv"
    compute = ctx.compute_dtype(op_type, dt)  # weights go in at the compute dtype directly
    kernel = quantized_kernel(ctx, layer) if layer.kernel_type is not None and compute == torch.float32 else \
        ctx.constant(layer.weights["kernel"].to(compute), "kernel")
    inputs = [ctx.cast(xs[0], dt, compute), kernel]
    if "bias" in layer.weights:
        inputs.append(ctx.constant(layer.weights["bias"].to(compute), "bias"))
    attrs = dict(strides=list(layer.stride), pads=list(layer.padding) * 2, dilations=list(layer.dilation),
                 group=layer.groups, kernel_shape=list(layer.weights["kernel"].shape[2:]))
    if layer.transposed and any(layer.output_padding):
        if any(p >= s for p, s in zip(layer.output_padding, layer.stride)):
            ctx.decline(f"output_padding={list(layer.output_padding)} not below stride={list(layer.stride)} (torch "
                        f"allows it below the dilation): ONNX Runtime's ConvTranspose refuses it")
        attrs["output_padding"] = list(layer.output_padding)
    return ctx.cast(ctx.node(op_type, inputs, **attrs)[0], compute, dt)


def _overhangs(layer: L.PoolingLayer) -> bool:
    """Whether a ceil_mode window may reach past the padded input (torch and ONNX count such windows differently);
    with symbolic dims, unless the ranges show it never does."""
    shape = layer.inputs[0].shape[-len(layer.window):]
    out = layer.outputs[0].shape[-len(layer.window):]
    return any(decide("gt", (o - 1) * s + k, n + 2 * p) is not False
               for n, o, k, s, p in zip(shape, out, layer.window, layer.stride, layer.padding))


def pads_into_max_pools(network: Network) -> tuple[set[int], dict[int, list[int]]]:
    """The constant -inf paddings (ids) that a max pool alone reads, and each such pool's ONNX pads with the padding
    folded in (TF's "same" max pooling, as timm writes it: F.pad with -inf, then a pool without padding). The pool's
    own padding is -inf too, so the values are the same; its input then holds no -inf that the guard of ORT's
    MaxPool would send to the reference. Folded where the pads are static, on the pooled dims only, not negative,
    each below the window (ORT's MaxPool refuses more), without dilation (a dilated window could then hold padding
    only: -inf in torch, the dtype's lowest in ORT, with no -inf left for the guard to see), and without ceil mode
    (torch and ONNX place its last window differently)."""
    readers = network.consumers()
    folded: set[int] = set()
    pads: dict[int, list[int]] = {}
    for pool in network.layers:
        if not isinstance(pool, L.PoolingLayer):
            continue
        pad = pool.inputs[0].producer
        if pool.type != L.PoolingType.MAX or pool.ceil_mode or any(d != 1 for d in pool.dilation or ()) or \
                not isinstance(pad, L.PaddingLayer) or \
                pad.mode != L.PaddingMode.CONSTANT or pad.value != float("-inf") or \
                network.sole_reader(pad.outputs[0], readers) is not pool:
            continue
        n = len(pool.window)
        if len(pad.pad) > 2 * n or any(not isinstance(p, int) or p < 0 for p in pad.pad):
            continue
        begins, ends = list(pool.padding), list(pool.padding)
        for i in range(len(pad.pad) // 2):  # torch's order: last dim first
            begins[n - 1 - i] += pad.pad[2 * i]
            ends[n - 1 - i] += pad.pad[2 * i + 1]
        if all(p < k for p, k in zip(begins + ends, pool.window * 2)):
            folded.add(id(pad))
            pads[id(pool)] = begins + ends
    return folded, pads


@exporter(L.PoolingLayer)
def _pooling(ctx: ExportContext, layer: L.PoolingLayer, xs: list[str]) -> str:
    dt = layer.inputs[0].dtype
    attrs = dict(kernel_shape=list(layer.window), strides=list(layer.stride),
                 pads=ctx.pool_pads.get(id(layer), list(layer.padding) * 2), ceil_mode=int(layer.ceil_mode))
    if layer.type == L.PoolingType.MAX:
        attrs["dilations"] = list(layer.dilation or (1,) * len(layer.window))
        producer = layer.inputs[0].producer
        if isinstance(producer, L.DequantizeLayer) and not per_tensor_int8(producer):
            # ONNX Runtime 1.32 aborts the process (a libstdc++ assertion in its QDQ transformers) on
            # DequantizeLinear -> MaxPool with the NaN and -inf guards below, which a dequantized fp8 value (NaN is
            # one) needs; a dequantized int8 value is finite and needs none
            ctx.decline("max pooling of a dequantized value other than int8's per tensor (ONNX Runtime's QDQ "
                        "transformers fail on it)")
        result = ctx.op("MaxPool", xs, dt, **attrs)
        if not dt.is_floating_point or isinstance(producer, L.DequantizeLayer):  # a dequantized int8 value is finite
            return result
        # torch's max pooling propagates NaN, ONNX Runtime's MaxPool skips it; and for a window of -inf only it gives
        # the dtype's lowest value. It is exact for input without NaN and -inf. With the guard output, such a call
        # is computed otherwise (`exact_below`: a sum over the input, which ORT reads in the NCHWc layout of the
        # convolutions around the pooling, whose chain an If would split).
        if ctx.guarded:
            x = producer.inputs[0] if id(producer) in ctx.folded_pads else layer.inputs[0]  # (the pool pads it)
            ctx.exact_below(xs[0], dt, x.shape)
            return result
        # Else both are fixed in a branch that runs only where the input holds NaN or -inf: its sum is NaN or -inf
        # then (and at worst, where finite values overflow, the exact branch runs for nothing).
        total = ctx.op("ReduceSum", xs, dt, keepdims=0)
        special = ctx.node("Or", [ctx.op("IsNaN", [total], dt, typed_outputs=()),
                                  ctx.op("Equal", [total, ctx.scalar(float("-inf"), dt)], dt, typed_outputs=())])[0]
        return ctx.branch(special, dt, lambda: _minus_inf_windows(
            ctx, xs[0], _nan_windows(ctx, xs[0], result, dt, attrs), dt, attrs), result)
    if layer.ceil_mode and _overhangs(layer):
        ctx.decline("average pooling with ceil_mode=True whose last window passes the padding: ONNX Runtime "
                    "divides it by another count than torch")
    if layer.divisor_override is None:
        return ctx.op("AveragePool", xs, dt, count_include_pad=int(layer.count_include_pad), **attrs)
    # sum / divisor_override = (mean over the whole window, padding included) * window size / divisor
    mean = ctx.op("AveragePool", xs, dt, count_include_pad=1, **attrs)
    return ctx.op("Mul", [mean, ctx.scalar(math.prod(layer.window) / layer.divisor_override, dt)], dt)


def _nan_windows(ctx: ExportContext, x: str, pooled: str, dt: torch.dtype, attrs: dict[str, object]) -> str:
    """`pooled` with NaN where its max pooling window of `x` holds a NaN."""
    flags = ctx.op("MaxPool", [ctx.cast(ctx.op("IsNaN", [x], dt, typed_outputs=()), torch.bool, dt)], dt, **attrs)
    found = ctx.op("Greater", [flags, ctx.scalar(0, dt)], dt, typed_outputs=())
    return ctx.op("Where", [found, ctx.scalar(float("nan"), dt), pooled], dt, typed=(1, 2))


def _minus_inf_windows(ctx: ExportContext, x: str, pooled: str, dt: torch.dtype, attrs: dict[str, object]) -> str:
    """`pooled` with -inf where its max pooling window of `x` holds -inf only (ORT's MaxPool leaves its start
    value, the dtype's lowest, there)."""
    above = ctx.node("Not", [ctx.op("IsInf", [x], dt, typed_outputs=(), detect_positive=0)])[0]
    flags = ctx.op("MaxPool", [ctx.cast(above, torch.bool, dt)], dt, **attrs)
    none = ctx.op("Equal", [flags, ctx.scalar(0, dt)], dt, typed_outputs=())
    return ctx.op("Where", [none, ctx.scalar(float("-inf"), dt), pooled], dt, typed=(1, 2))


def _swap_last_two(ctx: ExportContext, x: str, rank: int) -> str:
    return ctx.node("Transpose", [x], perm=list(range(rank - 2)) + [rank - 1, rank - 2])[0]


NARROW_LINEAR = 32  # inner or output width up to which a linear layer of 3-d or more input is exported as Gemm


def _narrow_linear(layer: L.MatrixMultiplyLayer) -> bool:
    """Whether `layer` is a linear layer of static 3-d or more input whose inner or output width is at most
    `NARROW_LINEAR`: exported as Reshape + Gemm + Reshape, the bias added in the product's output loop. ORT's
    sessions keep MatMul + Add apart otherwise (`DISABLED_OPTIMIZERS`: faster for wide layers), and an Add of a
    narrow bias over many rows is a pass that costs as much as such a product: 2 threads, [38809, 4] x [4, 4] 0.86
    ms as MatMul + Add against 0.45 as Gemm (a 4 -> 4 linear across attention heads over [1, 197, 197, 4] scores, 48
    a call: 1.15x the time of torch.onnx.export's graph, which writes them as Gemm), [1024, 64] x [64, 16] 0.108
    against 0.089; [1024, 256] x [256, 256] 1.08 against 1.15 (wide: MatMul + Add)."""
    (ta, tb), shape = layer.inputs, layer.outputs[0].shape
    return ta.rank >= 3 and tb.rank == 2 and layer.op0 == L.MatrixOperation.NONE \
        and all(isinstance(d, int) for d in (*ta.shape, *shape)) and min(ta.shape[-1], shape[-1]) <= NARROW_LINEAR


@exporter(L.MatrixMultiplyLayer)
def _matrix_multiply(ctx: ExportContext, layer: L.MatrixMultiplyLayer, xs: list[str]) -> str:
    if id(layer) in ctx.integer_matmuls:
        return integer_matrix_multiply(ctx, layer, xs)
    (ta, tb), out = layer.inputs, layer.outputs[0].dtype
    a, b = ctx.cast(xs[0], ta.dtype, out), ctx.cast(xs[1], tb.dtype, out)
    if layer.op0 == L.MatrixOperation.TRANSPOSE:
        a = _swap_last_two(ctx, a, ta.rank)
    if layer.op1 == L.MatrixOperation.TRANSPOSE:  # of a constant weight: ORT folds it at session start
        b = _swap_last_two(ctx, b, tb.rank)
    quantized = isinstance(tb.producer, L.DequantizeLayer)
    flat = layer.outputs[0].rank == 2
    if "bias" in layer.weights and not quantized and out == torch.float32 and (flat or _narrow_linear(layer)):
        rows = a if flat else ctx.node("Reshape", [a, ctx.ints([-1, ta.shape[-1]], "rows")])[0]
        y = ctx.node("Gemm", [rows, b, ctx.constant(layer.weights["bias"].to(out), "bias")])[0]
        return y if flat else ctx.node("Reshape", [y, ctx.ints(layer.outputs[0].shape, "shape")])[0]
    y = ctx.op("MatMul", [a, b], out)
    if "bias" not in layer.weights:
        return y
    bias = layer.weights["bias"].to(out)
    if not quantized:
        # 2-d float32: Gemm (ORT fuses an activation after it); else MatMul + Add, which ORT's sessions keep apart
        # (ORT's MatMulAddFusion off: onnxruntime.py) or fuse with a GELU after (BiasGelu)
        return ctx.op("Add", [y, ctx.constant(bias, "bias")], out)
    # Quantized: ORT would fuse MatMul + Add into a float Gemm before its QDQ fusions see the MatMul (and, for an
    # N-d one, fail making the Gemm's reshapes); a bias of rank 3 or more keeps the Add apart, so the MatMul runs
    # as MatMulIntegerToFloat. A 1-d or 2-d result is squeezed back.
    rank = layer.outputs[0].rank
    y = ctx.op("Add", [y, ctx.constant(bias.reshape([1] * (max(rank, 3) - 1) + [-1]), "bias")], out)
    return y if rank >= 3 else ctx.node("Squeeze", [y, ctx.ints(range(3 - rank), "axes")])[0]


_REDUCE = {L.ReduceOperation.SUM: "ReduceSum", L.ReduceOperation.PROD: "ReduceProd",
           L.ReduceOperation.MAX: "ReduceMax", L.ReduceOperation.MIN: "ReduceMin",
           L.ReduceOperation.AVG: "ReduceMean"}


@exporter(L.ReduceLayer)
def _reduce(ctx: ExportContext, layer: L.ReduceLayer, xs: list[str]) -> str:
    src, out, op = layer.inputs[0].dtype, layer.outputs[0].dtype, layer.op
    axes, keep = ctx.ints(layer.axes, "axes"), int(layer.keep_dims)
    if op == L.ReduceOperation.AVG and any(decide("eq", layer.inputs[0].shape[a], 0) is not False
                                           for a in layer.axes):
        ctx.decline(f"a mean over axes {list(layer.axes)} of a dim that may be empty: NaN in torch, 0 in ONNX "
                    f"Runtime")
    rank = layer.inputs[0].rank
    if op == L.ReduceOperation.AVG and src == out == torch.float32 and rank >= 3 and \
            sorted(a % rank for a in layer.axes) == list(range(2, rank)):
        # a mean over every spatial dim is GlobalAveragePool, which ORT runs in its NCHWc layout (MLAS's pooling)
        # between convolutions, where ReduceMean would need the layout reordered around it
        pooled = ctx.node("GlobalAveragePool", [xs[0]])[0]
        return pooled if keep else ctx.node("Reshape", [pooled, ctx.ints([0, 0], "shape")])[0]
    if op in _REDUCE:  # torch sums integers in int64: the cast to the output dtype comes first
        x = ctx.cast(xs[0], src, out)
        result = ctx.op(_REDUCE[op], [x, axes], out, typed=(0,), keepdims=keep)
        if op in (L.ReduceOperation.MAX, L.ReduceOperation.MIN) and out.is_floating_point:
            # torch.amax/amin propagate NaN; ONNX Runtime's ReduceMax/ReduceMin skip it
            nan = _count(ctx, ctx.op("IsNaN", [x], out, typed_outputs=()), axes, keep, "Greater")
            result = ctx.op("Where", [nan, ctx.scalar(float("nan"), out), result], out, typed=(1, 2))
        return result
    # any / all: count the true (any) or false (all) elements; an empty reduction counts 0.
    flag = ctx.cast(xs[0], src, torch.bool)
    if op == L.ReduceOperation.ALL:
        return ctx.cast(_count(ctx, ctx.node("Not", [flag])[0], axes, keep, "Equal"), torch.bool, out)
    return ctx.cast(_count(ctx, flag, axes, keep, "Greater"), torch.bool, out)


def _count(ctx: ExportContext, flags: str, axes: str, keep: int, test: str) -> str:
    """Whether the number of true `flags` over `axes` is greater than (test="Greater") or equal to 0."""
    count = ctx.node("ReduceSum", [ctx.cast(flags, torch.bool, torch.int64), axes], keepdims=keep)[0]
    return ctx.node(test, [count, ctx.scalar(0, torch.int64)])[0]


@exporter(L.SoftMaxLayer)
def _softmax(ctx: ExportContext, layer: L.SoftMaxLayer, xs: list[str]) -> str:
    dt = layer.inputs[0].dtype
    result = ctx.op("LogSoftmax" if layer.log else "Softmax", xs, dt, axis=layer.axis)
    if not (layer.log and dt == torch.float64):
        return result
    # ONNX Runtime's double LogSoftmax gives finite values in a row holding NaN or +inf, where torch gives NaN
    # (its float kernel agrees with torch): such rows are made NaN
    bad = ctx.node("Or", [ctx.op("IsNaN", xs, dt, typed_outputs=()), ctx.op("IsInf", xs, dt, typed_outputs=(),
                                                                           detect_negative=0)])[0]
    axes = ctx.ints([layer.axis], "axes")
    found = _count(ctx, bad, axes, 1, "Greater")
    return ctx.op("Where", [found, ctx.scalar(float("nan"), dt), result], dt, typed=(1, 2))


@exporter(L.NormalizationLayer)
def _normalization(ctx: ExportContext, layer: L.NormalizationLayer, xs: list[str]) -> str:
    x, dt = layer.inputs[0], layer.inputs[0].dtype
    scale, bias = layer.weights.get("scale"), layer.weights.get("bias")
    if layer.kind == L.NormalizationKind.GROUP and x.rank >= 3 and dt in (torch.float32, torch.float16) and \
            not is_symbolic(x.shape[1]) and all(decide("eq", d, 0) is False for d in x.shape):
        return _group_norm_as_instance_norm(ctx, layer, xs[0])
    if layer.kind == L.NormalizationKind.LAYER:
        op_type, shape = "LayerNormalization", layer.normalized_shape
        attrs = dict(axis=x.rank - len(shape))
    else:
        op_type, shape = ("GroupNormalization", (x.shape[1],)) if layer.kind == L.NormalizationKind.GROUP \
            else ("InstanceNormalization", (x.shape[1],))
        attrs = dict(num_groups=layer.num_groups) if layer.kind == L.NormalizationKind.GROUP else {}
        if is_symbolic(shape[0]):
            ctx.decline(f"kind={layer.kind.name} needs a static channel dim, got shape {x.shape}")
    compute = ctx.compute_dtype(op_type, dt)
    if scale is None:
        scale = torch.ones(shape)
    inputs = [ctx.cast(xs[0], dt, compute), ctx.constant(scale.reshape(shape).to(compute), "scale")]
    if bias is not None or layer.kind != L.NormalizationKind.LAYER:  # only layer norm's bias is optional
        inputs.append(ctx.constant((bias if bias is not None else torch.zeros(shape)).reshape(shape).to(compute),
                                   "bias"))
    return ctx.cast(ctx.node(op_type, inputs, epsilon=layer.epsilon, **attrs)[0], compute, dt)


def _group_norm_as_instance_norm(ctx: ExportContext, layer: L.NormalizationLayer, x: str) -> str:
    """Group norm as ORT runs it fast: InstanceNormalization over [N, groups, rest] (one kernel), then the
    per-channel scale and bias. ORT 1.32 has no CPU kernel for GroupNormalization and runs its function body, a
    dozen ops with shape arithmetic."""
    t, dt = layer.inputs[0], layer.inputs[0].dtype
    channels, groups = t.shape[1], layer.num_groups
    ones = ctx.constant(torch.ones(groups, dtype=dt), "scale")
    zeros = ctx.constant(torch.zeros(groups, dtype=dt), "bias")
    if groups == channels:  # one channel per group: the input as it is, and the affine in the instance norm
        scale, bias = layer.weights.get("scale"), layer.weights.get("bias")
        ones = ctx.constant((scale if scale is not None else torch.ones(groups)).reshape(groups).to(dt), "scale")
        zeros = ctx.constant((bias if bias is not None else torch.zeros(groups)).reshape(groups).to(dt), "bias")
        return ctx.op("InstanceNormalization", [x, ones, zeros], dt, epsilon=layer.epsilon)
    grouped = ctx.node("Reshape", [x, ctx.ints([0, groups, -1], "shape")])[0]
    normed = ctx.op("InstanceNormalization", [grouped, ones, zeros], dt, epsilon=layer.epsilon)
    y = ctx.node("Reshape", [normed, ctx.node("Shape", [x])[0]])[0]
    per_channel = (channels,) + (1,) * (t.rank - 2)
    if "scale" in layer.weights:
        y = ctx.op("Mul", [y, ctx.constant(layer.weights["scale"].reshape(per_channel).to(dt), "scale")], dt)
    if "bias" in layer.weights:
        y = ctx.op("Add", [y, ctx.constant(layer.weights["bias"].reshape(per_channel).to(dt), "bias")], dt)
    return y


@exporter(L.EinsumLayer)
def _einsum(ctx: ExportContext, layer: L.EinsumLayer, xs: list[str]) -> str:
    out = layer.outputs[0].dtype
    return ctx.op("Einsum", [ctx.cast(x, t.dtype, out) for x, t in zip(xs, layer.inputs)], out,
                  equation=layer.equation.replace(" ", ""))


@exporter(L.CumulativeLayer)
def _cumulative(ctx: ExportContext, layer: L.CumulativeLayer, xs: list[str]) -> str:
    if layer.op != L.CumulativeOperation.SUM:
        ctx.decline(f"op={layer.op.name}: ONNX has no cumulative product before opset 26, which ONNX Runtime's "
                    f"CPU provider does not run")
    src, out = layer.inputs[0].dtype, layer.outputs[0].dtype  # torch.cumsum of integers gives int64
    if layer.inputs[0].rank == 0:  # the sum of one value (ONNX's CumSum takes no 0-d input)
        return ctx.node("Identity", [ctx.cast(xs[0], src, out)])[0]
    return ctx.op("CumSum", [ctx.cast(xs[0], src, out), ctx.constant(torch.tensor(layer.axis), "axis")], out,
                  typed=(0,))


# torch's interpolate modes as ONNX Resize attributes (half_pixel is torch's align_corners=False mapping).
_RESIZE_MODES = {"linear": "linear", "bilinear": "linear", "trilinear": "linear", "bicubic": "cubic"}
# Multiply-adds per output up to which a bicubic resize is exported as products by its axes' interpolation matrices
# (`_resize_by_products`): ONNX Runtime's cubic Resize has no vector kernel and took 440-2000 ns an output on a 2-core
# AVX2 CPU (ORT 1.32: [1,3,240,240] to 224x224 66 ms, [1,21,28,28] to 224x224 102 ms), where its MatMul did 20-50
# multiply-adds a ns (the same two: 1.3 and 0.8 ms). Bilinear resizes stay Resize nodes: between convolutions ORT runs
# them in the NCHWc layout (Upsample), which the products (MatMul, in NCHW) tied at best (1.0-1.66x their time).
_CUBIC_PRODUCT_MACS = 4096


@exporter(L.ResizeLayer)
def _resize(ctx: ExportContext, layer: L.ResizeLayer, xs: list[str]) -> str:
    x, dt = layer.inputs[0], layer.inputs[0].dtype
    if layer.mode == "nearest":
        attrs = dict(mode="nearest", coordinate_transformation_mode="asymmetric", nearest_mode="floor")
    elif layer.mode == "nearest-exact":
        attrs = dict(mode="nearest", coordinate_transformation_mode="half_pixel", nearest_mode="round_prefer_ceil")
    elif layer.mode in _RESIZE_MODES:
        if not dt.is_floating_point:
            ctx.decline(f"mode={layer.mode!r} on {dtype_name(dt)}: only float inputs are exported")
        # torch weighs every neighbour, zero weights too (0 * inf is NaN); ORT skips some and mixes channels of
        # a 1-d resize with zero weights: the NaN and inf they give differ
        ctx.exact_below(xs[0], dt, x.shape)
        attrs = dict(mode=_RESIZE_MODES[layer.mode], cubic_coeff_a=-0.75, exclude_outside=0,
                     coordinate_transformation_mode="align_corners" if layer.align_corners else "half_pixel")
    else:
        ctx.decline(f"mode={layer.mode!r} has no ONNX Resize form")
    if layer.mode == "bicubic" and dt == torch.float32:
        products = _resize_by_products(ctx, layer, xs[0])
        if products is not None:
            return products
    if layer.scales is not None:
        spec = ["", ctx.constant(torch.tensor([1.0, 1.0, *layer.scales], dtype=torch.float32), "scales")]
    else:
        batch_channels = ctx.node("Shape", [xs[0]], start=0, end=2)[0] if has_symbols(x.shape[:2]) else \
            ctx.ints(x.shape[:2], "sizes")
        spec = ["", "", ctx.node("Concat", [batch_channels, ctx.shape_tensor(layer.size, "sizes")], axis=0)[0]]
    return ctx.op("Resize", [xs[0], *spec], dt, typed=(0,), **attrs)


def _resize_by_products(ctx: ExportContext, layer: L.ResizeLayer, x: str) -> str | None:
    """A resize of static rows and columns as x multiplied by each resized axis's interpolation matrix (the weights
    torch gives every input position, zeros too: a finite input's resize, which the caller's guard holds it to),
    the cheaper axis first; None where the sizes are symbolic or the products would cost more than
    `_CUBIC_PRODUCT_MACS` an output."""
    (h, w), (oh, ow) = layer.inputs[0].shape[2:], layer.outputs[0].shape[2:]
    if not all(isinstance(d, int) for d in (h, w, oh, ow)) or min(h, w, oh, ow) < 1:
        return None
    if min(h * w / oh + h, h * w / ow + w) > _CUBIC_PRODUCT_MACS:
        return None
    rows, columns = (_interpolation_matrix(layer, axis, n, out) for axis, (n, out) in enumerate(((h, oh), (w, ow))))
    rows_first = h * w / ow + w < h * w / oh + h

    def along_rows(v: str) -> str:  # [oh, h] @ [..., h, columns]
        return v if rows is None else ctx.op("MatMul", [ctx.constant(rows.t().contiguous(), "rows"), v], torch.float32)

    def along_columns(v: str) -> str:  # [..., rows, w] @ [w, ow]
        return v if columns is None else ctx.op("MatMul", [v, ctx.constant(columns, "columns")], torch.float32)

    return along_columns(along_rows(x)) if rows_first else along_rows(along_columns(x))


def _interpolation_matrix(layer: L.ResizeLayer, axis: int, n: int, out: int) -> torch.Tensor | None:
    """[n, out] float32: row j is torch's resize of the unit vector e_j along spatial `axis` (of n positions to
    `out`), computed by torch itself (the other axis of the basis image kept, exactly: scale 1 weighs one position by
    1); None where that is the identity."""
    size = None if layer.size is None else (n, out)
    scales = None if layer.scales is None else (1.0, layer.scales[axis])
    basis = torch.eye(n, dtype=torch.float32)[None, None]
    matrix = F.interpolate(basis, size=size, scale_factor=scales, mode=layer.mode,
                           align_corners=layer.align_corners)[0, 0]
    return None if matrix.shape == (n, n) and torch.equal(matrix, basis[0, 0]) else matrix


_GRID_MODES = {"bilinear": "linear", "nearest": "nearest", "bicubic": "cubic"}
_GRID_BOUND = 1e3  # |grid coordinates| ORT samples as torch does (measured to 3e4; reflection differs from 1e5)


@exporter(L.GridSampleLayer)
def _grid_sample(ctx: ExportContext, layer: L.GridSampleLayer, xs: list[str]) -> str:
    if layer.mode not in _GRID_MODES:
        ctx.decline(f"mode={layer.mode!r} has no ONNX GridSample form")
    if layer.padding_mode not in ("zeros", "border", "reflection"):
        ctx.decline(f"padding_mode={layer.padding_mode!r} has no ONNX GridSample form")
    # NaN, inf (and, in the grid, coordinates far outside [-1, 1]) propagate or round otherwise in ORT
    ctx.exact_below(xs[0], layer.inputs[0].dtype, layer.inputs[0].shape)
    ctx.exact_below(xs[1], layer.inputs[1].dtype, layer.inputs[1].shape, _GRID_BOUND)
    return ctx.op("GridSample", xs, layer.outputs[0].dtype, mode=_GRID_MODES[layer.mode],
                  padding_mode=layer.padding_mode, align_corners=int(layer.align_corners))


def _causal_keep(ctx: ExportContext, lq, lk) -> str:
    """torch's causal mask, ones(lq, lk).tril(): key j is kept for query i where j <= i (lengths may be symbolic)."""
    if not has_symbols([lq, lk]):
        return ctx.constant(torch.ones(lq, lk, dtype=torch.bool).tril(), "causal")
    zero, one, axes = ctx.dim_scalar(0), ctx.dim_scalar(1), ctx.ints([1], "axes")
    rows = ctx.node("Unsqueeze", [ctx.node("Range", [zero, ctx.dim_scalar(lq), one])[0], axes])[0]  # [lq, 1]
    columns = ctx.node("Range", [zero, ctx.dim_scalar(lk), one])[0]  # [lk]
    return ctx.node("LessOrEqual", [columns, rows])[0]


@exporter(L.AttentionLayer)
def _attention(ctx: ExportContext, layer: L.AttentionLayer, xs: list[str]) -> str:
    """scaled_dot_product_attention: ONNX's Attention op from opset 23 (4-d inputs), else MatMul-Softmax-MatMul."""
    (tq, tk, tv), dt = layer.inputs[:3], layer.outputs[0].dtype
    # Masks are added, as torch adds them (-inf where a key is masked): a NaN or +inf score there gives NaN.
    bias = _additive(ctx, _causal_keep(ctx, tq.shape[-2], tk.shape[-2]), dt) if layer.causal else None
    if len(xs) > 3:
        mask, tmask = xs[3], layer.inputs[3]
        mask = _additive(ctx, mask, dt) if tmask.dtype == torch.bool else ctx.cast(mask, tmask.dtype, dt)
        bias = mask if bias is None else ctx.op("Add", [bias, mask], dt)
    if _fits_attention_op(ctx, layer):
        return _attention_op(ctx, layer, xs[:3], bias, len(xs) > 3)
    q, k, v = xs[:3]
    if layer.enable_gqa and tk.shape[-3] != tq.shape[-3]:
        k, v = _repeat_heads(ctx, k, tk, tq.shape[-3]), _repeat_heads(ctx, v, tv, tq.shape[-3])
    if layer.scale is None and is_symbolic(tq.shape[-1]):
        ctx.decline(f"the default scale 1/sqrt({tq.shape[-1]}) of a dynamic head dim")
    scale = layer.scale if layer.scale is not None else 1.0 / math.sqrt(tq.shape[-1])
    scores = ctx.op("MatMul", [q, _swap_last_two(ctx, k, tk.rank)], dt)
    scores = ctx.op("Mul", [scores, ctx.scalar(scale, dt)], dt)
    if ctx.guarded:
        return _guarded_attention(ctx, layer, scores, bias, v, len(xs) > 3)
    if bias:
        scores = ctx.op("Add", [scores, bias], dt)
    return ctx.op("MatMul", [_safe_softmax(ctx, scores, dt), v], dt)


def _fits_attention_op(ctx: ExportContext, layer: L.AttentionLayer) -> bool:
    """Whether the layer is ONNX's Attention op (opset 23): 4-d q, k and v of one batch and one number of heads (ONNX
    Runtime's kernel broadcasts neither), a batch, query and key sequence never empty and a scale that is the default
    or positive and finite (the kernel refuses the others); in a file for any runtime, no run-time float mask (ORT's
    kernel gives 0 for a query whose every score is the lowest float, torch the mean of v: a session's guard reports
    it)."""
    (tq, tk, tv), float_mask = layer.inputs[:3], len(layer.inputs) > 3 and layer.inputs[3].dtype != torch.bool
    return ctx.opset >= 23 and tq.rank == tk.rank == tv.rank == 4 and \
        tq.shape[0] == tk.shape[0] == tv.shape[0] and tq.shape[1] == tk.shape[1] == tv.shape[1] and \
        all(bounds(d)[0] >= 1 for d in (tq.shape[0], tq.shape[-2], tk.shape[-2])) and \
        (layer.scale is None or 0 < layer.scale < math.inf) and (ctx.guarded or not float_mask)


def _attention_op(ctx: ExportContext, layer: L.AttentionLayer, qkv: list[str], bias: str | None, masked: bool) -> str:
    """ONNX's Attention op (opset 23), with torch's answers where a plain softmax gives others. A query that a run-time
    mask masks whole gives 0 in torch. In a file for any runtime, its mask row is made 0 and its output multiplied
    by 0 (as in `_guarded_attention`). Under the guard (ONNX Runtime's sessions), ORT's kernel gives 0 there itself
    (tests/test_onnx_export.py checks that of the installed ORT), and a NaN or infinite output (a q.k that is not
    finite, or a kernel that gives NaN there) sends the call to the reference."""
    dt, keep = layer.outputs[0].dtype, None
    lq, lk = layer.inputs[0].shape[-2], layer.inputs[1].shape[-2]
    if masked and not layer.causal and tuple(layer.inputs[3].shape[-2:]) != (lq, lk):
        # ORT's kernel broadcasts a mask over batch and heads only: [..., 1, k] or [..., q, 1] is expanded
        bias = ctx.node("Expand", [bias, ctx.shape_tensor([lq, lk], "mask_shape")])[0]
    if masked and layer.inputs[3].dtype != torch.bool:
        # a query whose every score is the lowest float gets 0 from ORT's kernel, the mean of v from torch
        lowest = ctx.op("Equal", [ctx.op("ReduceMax", [bias, ctx.ints([-1], "axes")], dt, typed=(0,), keepdims=1),
                                  ctx.scalar(torch.finfo(dt).min, dt)], dt, typed_outputs=())
        at_lowest = ctx.op("Where", [lowest, ctx.scalar(math.inf, dt), ctx.scalar(0, dt)], dt, typed=(1, 2))
        ctx.exact_below(at_lowest, dt, (*layer.inputs[3].shape[:-2], lq, 1))  # (bias: the mask over [q, k])
    if masked and not ctx.guarded:
        bias, keep = _masked_whole(ctx, bias, dt)
    attrs = {"scale": layer.scale} if layer.scale is not None else {}
    heads, dims = layer.inputs[0].shape[1], [t.shape[-1] for t in layer.inputs[:3]]
    if all(isinstance(d, int) for d in (heads, *dims)):
        # [batch, heads, seq, dim] <-> [batch, seq, heads * dim]: ONNX Runtime cancels these transposes against
        # the inverse ones that made q, k and v from [batch, seq, heads * dim] projections and that read the output
        # (an encoder of 4 attention layers: 16 transposes, 1.0 of its 20 ms)
        flat = [ctx.node("Reshape", [ctx.node("Transpose", [x], perm=[0, 2, 1, 3])[0],
                                     ctx.ints([0, 0, heads * d], "shape")])[0] for x, d in zip(qkv, dims)]
        flat_out = ctx.op("Attention", [*flat, *([bias] if bias else [])], dt, q_num_heads=heads,
                          kv_num_heads=heads, **attrs)
        out = ctx.node("Transpose", [ctx.node("Reshape", [flat_out, ctx.ints([0, 0, heads, dims[2]], "shape")])[0]],
                       perm=[0, 2, 1, 3])[0]
        shape = layer.outputs[0].shape
        guarded, guarded_shape = flat_out, (shape[0], shape[2], heads * dims[2])  # the guard reads it untransposed
    else:
        out = guarded = ctx.op("Attention", [*qkv, *([bias] if bias else [])], dt, **attrs)
        guarded_shape = layer.outputs[0].shape
    if ctx.guarded:
        ctx.exact_below(guarded, dt, guarded_shape)
    return ctx.op("Mul", [out, keep], dt) if keep else out


def _guarded_attention(ctx: ExportContext, layer: L.AttentionLayer, scores: str, bias: str | None, v: str,
                       masked: bool) -> str:
    """Softmax and the product with v under the guard output: a plain Softmax, exact as torch's safe softmax.
    A Softmax differs from it only for a query whose every score is -inf (NaN there, where torch gives 0), so:
    - a query that a run-time mask (added as -inf) masks whole is found from the mask alone: its mask row becomes 0
      (its Softmax is then finite, or NaN where a q.k is NaN or +inf, as torch's) and its output is multiplied by 0
      (0, or NaN where torch's 0 * v is NaN);
    - any other query's scores are all -inf only where q.k is not finite (the causal mask keeps key 0 for every
      query): its Softmax is NaN, and so is its output, which the guard output reports (the call then runs on the
      reference). The output is guarded rather than the scores: [..., q, dv] is read once, not [..., q, k]."""
    dt, keep = layer.outputs[0].dtype, None
    if masked:
        bias, keep = _masked_whole(ctx, bias, dt)
    probabilities = ctx.op("Softmax", [ctx.op("Add", [scores, bias], dt) if bias else scores], dt, axis=-1)
    out = ctx.op("MatMul", [probabilities, v], dt)
    ctx.exact_below(out, dt, layer.outputs[0].shape)
    return ctx.op("Mul", [out, keep], dt) if keep else out


def _masked_whole(ctx: ExportContext, bias: str, dt: torch.dtype) -> tuple[str, str]:
    """The additive mask with the rows of queries it masks whole made 0 (their softmax then finite), and a factor
    that is 0 for those queries and 1 elsewhere (their output times it: torch's 0)."""
    whole = _every_minus_inf(ctx, bias, dt)  # [..., q or 1, 1]: a query masked whole
    return (ctx.op("Where", [whole, ctx.scalar(0, dt), bias], dt, typed=(1, 2)),
            ctx.op("Where", [whole, ctx.scalar(0, dt), ctx.scalar(1, dt)], dt, typed=(1, 2)))


def _repeat_heads(ctx: ExportContext, x: str, t: Tensor, heads: int) -> str:
    """k or v of grouped-query attention [..., G, S, E] with each head repeated to `heads` ([..., heads, S, E]:
    head h is input head h // (heads / G), as SDPA's enable_gqa reads it)."""
    if any(is_symbolic(d) for d in (heads, t.shape[-3], t.shape[-1])):
        ctx.decline("grouped-query attention with a dynamic number of heads or head dim")
    repeat = heads // t.shape[-3]
    axis = t.rank - 2  # [..., G, 1, S, E] -> [..., G, repeat, S, E] -> [..., heads, S, E]
    grown = ctx.node("Unsqueeze", [x, ctx.ints([axis], "axes")])[0]
    grown = ctx.node("Expand", [grown, ctx.ints([1] * axis + [repeat, 1, 1], "repeat")])[0]
    return ctx.node("Reshape", [grown, ctx.ints([0] * (t.rank - 3) + [heads, -1, t.shape[-1]], "heads")])[0]


def _additive(ctx: ExportContext, keep: str, dt: torch.dtype) -> str:
    """A bool mask (True keeps a key) as the float mask torch adds to the scores: 0 where kept, else -inf."""
    return ctx.op("Where", [keep, ctx.scalar(0, dt), ctx.scalar(float("-inf"), dt)], dt, typed=(1, 2))


def _every_minus_inf(ctx: ExportContext, x: str, dt: torch.dtype) -> str:
    """Whether every value along x's last axis is -inf (bool, that axis kept as 1). The max says no value is above
    -inf but for NaN (which ORT's ReduceMax may skip), the sum that none is NaN or +inf, whatever the order of the
    additions."""
    axes = ctx.ints([-1], "axes")
    minus_inf = ctx.scalar(float("-inf"), dt)
    most = ctx.op("ReduceMax", [x, axes], dt, typed=(0,), keepdims=1)
    total = ctx.op("ReduceSum", [x, axes], dt, typed=(0,), keepdims=1)
    return ctx.node("And", [ctx.op("Equal", [most, minus_inf], dt, typed_outputs=()),
                            ctx.op("Equal", [total, minus_inf], dt, typed_outputs=())])[0]


def _safe_softmax(ctx: ExportContext, scores: str, dt: torch.dtype) -> str:
    """Softmax over the last axis, 0 for a query whose every score is -inf (all its keys masked), as torch's
    SDPA computes it (ATen's _safe_softmax); a plain Softmax gives NaN there. Two reads of the scores and a Where,
    where comparing every score with -inf took three passes more."""
    every = _every_minus_inf(ctx, scores, dt)
    return ctx.op("Where", [every, ctx.scalar(0, dt), ctx.op("Softmax", [scores], dt, axis=-1)], dt, typed=(1, 2))
