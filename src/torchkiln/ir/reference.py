"""The meaning of every layer kind, as ATen ops. Shape inference, constant folding and every other
runtime are defined against these functions.

A meaning takes (layer, inputs, weights, device) and returns one tensor or a list of them. It must
not modify its inputs or weights.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch._subclasses.fake_tensor import FakeTensor
import torch.nn.functional as F

from torchkiln.errors import EngineIndexError, EngineInputError, NetworkError
from torchkiln.ir import layers as L, pointwise

Meaning = Callable[[L.Layer, list[torch.Tensor], dict[str, torch.Tensor], torch.device],
                   "torch.Tensor | list[torch.Tensor]"]
MEANINGS: dict[type[L.Layer], Meaning] = {}


def meaning(kind: type[L.Layer]) -> Callable[[Meaning], Meaning]:
    def register(fn: Meaning) -> Meaning:
        MEANINGS[kind] = fn
        return fn

    return register


def run_layer(layer: L.Layer, inputs: list[torch.Tensor], weights: dict[str, torch.Tensor],
              device: torch.device) -> list[torch.Tensor]:
    """Compute one layer's outputs."""
    fn = MEANINGS.get(type(layer))
    if fn is None:
        raise NetworkError(f"layer kind {layer.KIND!r} has no reference meaning")
    out = fn(layer, inputs, weights, device)
    return list(out) if isinstance(out, (list, tuple)) else [out]


def _upcast(x: torch.Tensor) -> torch.Tensor:
    """Numerically sensitive layers compute half-precision inputs in float32."""
    return x.float() if x.dtype in (torch.float16, torch.bfloat16) else x


@meaning(L.ConstantLayer)
def _constant(layer, xs, ws, device):
    return ws["value"]


@meaning(L.IdentityLayer)
def _identity(layer, xs, ws, device):
    return xs[0]


@meaning(L.CastLayer)
def _cast(layer, xs, ws, device):
    return xs[0].to(layer.to_type)


def quantize(x: torch.Tensor, scale: torch.Tensor, zero_point: torch.Tensor | None, quant_type: torch.dtype,
             bounds: tuple[int, int] | None = None, divide: bool = False) -> torch.Tensor:
    """x in quant_type: torch.fake_quantize_*'s arithmetic (x times the float32 reciprocal of the scale, or x
    divided by the scale where `divide`, as ONNX's QuantizeLinear; rounded half to even, plus the zero point,
    clamped to `bounds`, else the type's range); fp8 saturates to its largest finite value, then rounds to nearest
    even. NaN becomes the lowest value in int8 (as ATen's kernels give it on x86; C++ leaves the conversion
    undefined), NaN in fp8."""
    lo, hi = bounds or L.QUANT_RANGE[quant_type]
    scaled = x.float() / scale if divide else x.float() * torch.reciprocal(scale)
    if quant_type == torch.int8:
        zero = 0 if zero_point is None else zero_point.float()
        return (torch.round(scaled) + zero).nan_to_num(lo).clamp(lo, hi).to(torch.int8)
    return scaled.clamp(lo, hi).to(quant_type)


def dequantize(q: torch.Tensor, scale: torch.Tensor, zero_point: torch.Tensor | None,
               to_type: torch.dtype = torch.float32) -> torch.Tensor:
    """(q - zero_point) * scale, computed in float32."""
    x = q.float() if zero_point is None else q.float() - zero_point.float()
    return (x * scale).to(to_type)


@meaning(L.QuantizeLayer)
def _quantize(layer, xs, ws, device):
    rank = xs[0].dim()
    zero = ws.get("zero_point")
    return quantize(xs[0], layer.shaped(ws["scale"], rank), None if zero is None else layer.shaped(zero, rank),
                    layer.quant_type, (layer.quant_min, layer.quant_max) if layer.quant_type == torch.int8 else None,
                    layer.divide)


@meaning(L.DequantizeLayer)
def _dequantize(layer, xs, ws, device):
    rank = xs[0].dim()
    zero = ws.get("zero_point")
    return dequantize(xs[0], layer.shaped(ws["scale"], rank), None if zero is None else layer.shaped(zero, rank),
                      layer.to_type)


@meaning(L.ConvolutionLayer)
def _convolution(layer, xs, ws, device):
    nd = ws["kernel"].dim() - 2
    output_padding = list(layer.output_padding) or [0] * nd
    return torch.convolution(xs[0], ws["kernel"], ws.get("bias"), list(layer.stride), list(layer.padding),
                             list(layer.dilation), layer.transposed, output_padding, layer.groups)


@meaning(L.ScaleLayer)
def _scale(layer, xs, ws, device):
    x = xs[0]

    def shaped(w: torch.Tensor) -> torch.Tensor:
        if layer.mode == L.ScaleMode.CHANNEL:
            axis = layer.channel_axis % x.dim()
            return w.reshape([-1] + [1] * (x.dim() - axis - 1))
        return w

    if "scale" in ws:
        x = x * shaped(ws["scale"])
    if "shift" in ws:
        x = x + shaped(ws["shift"])
    if "power" in ws:
        x = x ** shaped(ws["power"])
    return x


@meaning(L.ActivationLayer)
def _activation(layer, xs, ws, device):
    return pointwise.ACTIVATION[layer.type].reference(xs[0], layer.alpha, layer.beta)


@meaning(L.ParametricReLULayer)
def _prelu(layer, xs, ws, device):
    return F.prelu(xs[0], ws["slope"])


@meaning(L.ElementWiseLayer)
def _elementwise(layer, xs, ws, device):
    return pointwise.ELEMENTWISE[layer.op].reference(xs[0], xs[1])


@meaning(L.UnaryLayer)
def _unary(layer, xs, ws, device):
    return pointwise.UNARY[layer.op].reference(xs[0])


@meaning(L.PoolingLayer)
def _pooling(layer, xs, ws, device):
    nd = len(layer.window)
    if nd not in (1, 2, 3):
        raise NetworkError(f"pooling layer {layer.name!r}: window {layer.window} must be 1-, 2- or 3-d")
    if layer.type == L.PoolingType.MAX:
        fn = (F.max_pool1d, F.max_pool2d, F.max_pool3d)[nd - 1]
        return fn(xs[0], layer.window, layer.stride, layer.padding, layer.dilation or 1, layer.ceil_mode)
    if layer.dilation and any(d != 1 for d in layer.dilation):
        raise NetworkError(f"pooling layer {layer.name!r}: average pooling has no dilation")
    if nd == 1:
        if layer.divisor_override is not None:
            raise NetworkError(f"pooling layer {layer.name!r}: 1-d average pooling has no divisor_override")
        return F.avg_pool1d(xs[0], layer.window, layer.stride, layer.padding, layer.ceil_mode, layer.count_include_pad)
    fn = F.avg_pool2d if nd == 2 else F.avg_pool3d
    return fn(xs[0], layer.window, layer.stride, layer.padding, layer.ceil_mode, layer.count_include_pad,
              layer.divisor_override)


@meaning(L.MatrixMultiplyLayer)
def _matmul(layer, xs, ws, device):
    a, b = xs
    bias = ws.get("bias")
    if layer.op0 == L.MatrixOperation.NONE and layer.op1 == L.MatrixOperation.TRANSPOSE and b.dim() == 2 \
            and a.dim() >= 1 and (bias is None or bias.dim() <= 1):
        return F.linear(a, b, bias)  # x @ W.t() + bias as one GEMM, as nn.Linear computes it
    if layer.op0 == L.MatrixOperation.NONE and layer.op1 == L.MatrixOperation.NONE and b.dim() == 2 \
            and a.dim() >= 2 and bias is not None and bias.dim() <= 1 and a.is_floating_point():
        # x @ W + bias (W stored [in, out], as GPT-2's Conv1D holds it) as one GEMM with the bias in its epilogue
        out = torch.addmm(bias, a.reshape(-1, a.shape[-1]), b)
        return out.reshape(*a.shape[:-1], b.shape[-1])
    if layer.op0 == L.MatrixOperation.TRANSPOSE:
        a = a.transpose(-1, -2)
    if layer.op1 == L.MatrixOperation.TRANSPOSE:
        b = b.transpose(-1, -2)
    out = torch.matmul(a, b)
    return out if bias is None else out + bias


@meaning(L.ShuffleLayer)
def _shuffle(layer, xs, ws, device):
    x = xs[0]
    if layer.first_transpose is not None:
        x = x.permute(layer.first_transpose)
    if layer.reshape_dims is not None:
        dims = [x.shape[i] if d == 0 and layer.zero_is_placeholder else d for i, d in enumerate(layer.reshape_dims)]
        x = x.reshape(dims)
    if layer.second_transpose is not None:
        x = x.permute(layer.second_transpose)
    return x


@meaning(L.ReduceLayer)
def _reduce(layer, xs, ws, device):
    x, axes, keep = xs[0], list(layer.axes), layer.keep_dims
    if not axes:
        raise NetworkError(f"reduce layer {layer.name!r} needs at least one axis")
    op = layer.op
    if op == L.ReduceOperation.SUM:
        return torch.sum(x, axes, keepdim=keep)
    if op == L.ReduceOperation.AVG:
        return torch.mean(x, axes, keepdim=keep)
    if op == L.ReduceOperation.MAX:
        return torch.amax(x, axes, keepdim=keep)
    if op == L.ReduceOperation.MIN:
        return torch.amin(x, axes, keepdim=keep)
    if op == L.ReduceOperation.ANY:
        return torch.any(x, tuple(axes), keepdim=keep)
    if op == L.ReduceOperation.ALL:
        return torch.all(x, tuple(axes), keepdim=keep)
    for axis in sorted((a % x.dim() for a in axes), reverse=True):  # PROD reduces one axis at a time
        x = torch.prod(x, axis, keepdim=keep)
    return x


@meaning(L.SoftMaxLayer)
def _softmax(layer, xs, ws, device):
    x = xs[0]
    fn = torch.log_softmax if layer.log else torch.softmax
    return fn(_upcast(x), layer.axis).to(x.dtype)


@meaning(L.ConcatenationLayer)
def _concatenation(layer, xs, ws, device):
    return torch.cat(xs, layer.axis)


@meaning(L.SliceLayer)
def _slice(layer, xs, ws, device):
    x = xs[0]
    if not len(layer.start) == len(layer.shape) == len(layer.stride) == x.dim():
        raise NetworkError(f"slice layer {layer.name!r}: start/shape/stride must have one entry per dim")
    index: list[slice] = []
    for dim, (start, size, step) in enumerate(zip(layer.start, layer.shape, layer.stride)):
        if step == 0:
            raise NetworkError(f"slice layer {layer.name!r}: stride 0 on dim {dim}")
        if size and not 0 <= start + (size - 1) * step < x.shape[dim]:
            raise NetworkError(f"slice layer {layer.name!r}: dim {dim} of size {x.shape[dim]} has no "
                               f"{size} elements from {start} by {step}")
        if step > 0:
            index.append(slice(start, start + (size - 1) * step + 1 if size else start, step))
        else:
            idx = start + step * torch.arange(size, device=x.device)
            x = x.index_select(dim, idx)
            index.append(slice(None))
    return x[tuple(index)]


@meaning(L.ExpandLayer)
def _expand(layer, xs, ws, device):
    return xs[0].expand(layer.shape)


def _check_indices(layer: L.Layer, idx: torch.Tensor, dim: int, size: int) -> None:
    """Raise EngineIndexError unless every index is in [0, size): a gather never wraps negative indices
    (eager's embedding, index_select and gather raise; advanced indexing's converter wraps them first)."""
    if idx.device.type == "meta" or isinstance(idx, FakeTensor):  # shape inference: no values to check
        return
    if idx.numel() == 0:
        return
    bad = (idx < 0) | (idx >= size)
    if bool(bad.any()):
        value = int(idx[bad].flatten()[0])
        raise EngineIndexError(f"gather layer {layer.name!r}: index {value} is out of range for dim {dim} of "
                               f"size {size}; valid indices are 0..{size - 1}")


@meaning(L.GatherLayer)
def _gather(layer, xs, ws, device):
    return gather(layer, xs[0], xs[1])


def gather(layer: L.GatherLayer, data: torch.Tensor, idx: torch.Tensor, check: bool = True) -> torch.Tensor:
    """The gather meaning; `check=False` leaves out the index check (a backend whose kernels check on the device,
    where a host check would synchronize every call)."""
    if layer.mode == L.GatherMode.ELEMENT:
        axis = layer.axis % data.dim()
        if check:
            _check_indices(layer, idx, axis, data.shape[axis])
        return torch.gather(data, layer.axis, idx)
    if layer.mode == L.GatherMode.ND:
        if check:
            for dim in range(idx.shape[-1]):
                _check_indices(layer, idx[..., dim], dim, data.shape[dim])
        return data[tuple(idx.movedim(-1, 0))]
    axis = layer.axis % data.dim()
    if check:
        _check_indices(layer, idx, axis, data.shape[axis])
    flat = torch.index_select(data, axis, idx.reshape(-1))
    return flat.reshape(tuple(data.shape[:axis]) + tuple(idx.shape) + tuple(data.shape[axis + 1:]))


@meaning(L.ScatterLayer)
def _scatter(layer, xs, ws, device):
    return torch.scatter(xs[0], layer.axis, xs[1], xs[2])


@meaning(L.SelectLayer)
def _select(layer, xs, ws, device):
    return torch.where(xs[0], xs[1], xs[2])


@meaning(L.TopKLayer)
def _topk(layer, xs, ws, device):
    x, largest = xs[0], layer.op == L.TopKOperation.MAX
    if layer.k == 1:  # first occurrence on ties, like argmax/argmin
        values, indices = (torch.max if largest else torch.min)(x, layer.axis, keepdim=True)
        return [values, indices]
    values, indices = torch.topk(x, layer.k, layer.axis, largest=largest, sorted=True)
    return [values, indices]


@meaning(L.ResizeLayer)
def _resize(layer, xs, ws, device):
    if (layer.size is None) == (layer.scales is None):
        raise NetworkError(f"resize layer {layer.name!r} needs exactly one of size and scales")
    return F.interpolate(xs[0], size=layer.size, scale_factor=layer.scales, mode=layer.mode,
                         align_corners=layer.align_corners)


@meaning(L.PaddingLayer)
def _padding(layer, xs, ws, device):
    if layer.mode == L.PaddingMode.CONSTANT:
        return F.pad(xs[0], layer.pad, "constant", layer.value)
    return F.pad(xs[0], layer.pad, layer.mode.value)


@meaning(L.NormalizationLayer)
def _normalization(layer, xs, ws, device):
    x = xs[0]
    scale, bias = ws.get("scale"), ws.get("bias")
    if x.dtype in (torch.float16, torch.bfloat16):
        x32 = x.float()
        scale = None if scale is None else scale.float()
        bias = None if bias is None else bias.float()
    else:
        x32 = x
    if layer.kind == L.NormalizationKind.LAYER:
        out = F.layer_norm(x32, layer.normalized_shape, scale, bias, layer.epsilon)
    elif layer.kind == L.NormalizationKind.GROUP:
        out = F.group_norm(x32, layer.num_groups, scale, bias, layer.epsilon)
    else:
        out = F.instance_norm(x32, weight=scale, bias=bias, eps=layer.epsilon)
    return out.to(x.dtype)


@meaning(L.EinsumLayer)
def _einsum(layer, xs, ws, device):
    return torch.einsum(layer.equation, *xs)


@meaning(L.CumulativeLayer)
def _cumulative(layer, xs, ws, device):
    fn = torch.cumsum if layer.op == L.CumulativeOperation.SUM else torch.cumprod
    return fn(xs[0], layer.axis)


@meaning(L.FillLayer)
def _fill(layer, xs, ws, device):
    if layer.length < 0:
        raise NetworkError(f"fill layer {layer.name!r}: negative length {layer.length}")
    index = torch.arange(layer.length, dtype=torch.float64, device=device)
    return (index * layer.step + layer.start).to(layer.dtype)


@meaning(L.ShapeLayer)
def _shape(layer, xs, ws, device):
    return torch.tensor(tuple(xs[0].shape), dtype=torch.int64, device=device)


@meaning(L.GridSampleLayer)
def _grid_sample(layer, xs, ws, device):
    return F.grid_sample(xs[0], xs[1], mode=layer.mode, padding_mode=layer.padding_mode,
                         align_corners=layer.align_corners)


@meaning(L.AttentionLayer)
def _attention(layer, xs, ws, device):
    q, k, v = xs[:3]
    mask = xs[3] if len(xs) > 3 else None
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=layer.causal, scale=layer.scale,
                                          enable_gqa=layer.enable_gqa)


@meaning(L.DimValueLayer)
def _dim_value(layer, xs, ws, device):
    return torch.full((), layer.value, dtype=layer.dtype, device=device)


@meaning(L.NonZeroLayer)
def _non_zero(layer, xs, ws, device):
    return torch.nonzero(xs[0])


@meaning(L.UniqueLayer)
def _unique(layer, xs, ws, device):
    if layer.consecutive:
        return list(torch.unique_consecutive(xs[0], return_inverse=True, return_counts=True))
    return list(torch._unique2(xs[0], sorted=True, return_inverse=True, return_counts=True))


def run_network(network, inputs: list[torch.Tensor], device: torch.device) -> list[torch.Tensor]:
    """A (sub-)network's outputs: its layers' meanings in order, each intermediate dropped after its last reader."""
    values = {id(t): x for t, x in zip(network.inputs, inputs)}
    for layer in network.layers:
        weights = {k: w.to(device) for k, w in layer.weights.items()}
        outs = run_layer(layer, [values[id(t)] for t in layer.inputs], weights, device)
        values.update(zip(map(id, layer.outputs), outs))
    return [values[id(t)] for t in network.outputs]


def _fresh(results: list[torch.Tensor]) -> torch.Tensor | list[torch.Tensor]:
    """Copies of a control-flow layer's results: a branch or body may give back one of its inputs, a view of one or
    a constant's weight, and no output may share memory with those. One result as a tensor (as every one-output
    meaning gives it)."""
    fresh = [r.clone() for r in results]
    return fresh[0] if len(fresh) == 1 else fresh


RunNetwork = Callable[["object", list[torch.Tensor]], list[torch.Tensor]]


def conditional(layer: L.ConditionalLayer, xs: list[torch.Tensor], run: RunNetwork,
                taken: bool | None = None) -> torch.Tensor | list:
    """The taken branch's outputs, each sub-network run by `run(network, inputs)` (a backend's own runner). The
    predicate is read from xs[0] unless `taken` gives it (a runner that knew it beforehand: ir/shape_only.py)."""
    if taken is None:
        taken = bool(xs[0])
    return _fresh(run(layer.then_branch if taken else layer.else_branch, xs[1:]))


def loop(layer: L.LoopLayer, xs: list[torch.Tensor], run: RunNetwork, device: torch.device,
         iterations: Sequence[torch.Tensor] | None = None) -> torch.Tensor | list:
    """The carried values after the iterations, the body run by `run(network, inputs)`. Where `iterations` gives
    them (a runner that knew the course beforehand: ir/shape_only.py), the body runs once per given 0-d iteration
    tensor, and neither the trip count nor a condition is read."""
    carried, read = xs[2:2 + layer.num_carried], xs[2 + layer.num_carried:]
    if iterations is not None:
        if len(iterations) > layer.max_trips:
            raise _too_many_trips(layer)
        for i in iterations:
            carried = run(layer.body, [i, *carried, *read])[1:]
        return _fresh(carried)
    trips, go = int(xs[0]), bool(xs[1])
    i = 0
    while go and i < trips:
        if i == layer.max_trips:
            raise _too_many_trips(layer)
        outs = run(layer.body, [torch.tensor(i, device=device), *carried, *read])
        go, carried = bool(outs[0]), outs[1:]
        i += 1
    return _fresh(carried)


def _too_many_trips(layer: L.LoopLayer) -> EngineInputError:
    return EngineInputError(f"loop layer {layer.name!r}: these inputs need more than its {layer.max_trips} iterations")


@meaning(L.ConditionalLayer)
def _conditional(layer, xs, ws, device):
    return conditional(layer, xs, lambda network, inputs: run_network(network, inputs, device))


@meaning(L.LoopLayer)
def _loop(layer, xs, ws, device):
    return loop(layer, xs, lambda network, inputs: run_network(network, inputs, device), device)
