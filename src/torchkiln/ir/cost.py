"""What running a layer's reference meaning may cost, at the largest shapes its dims can take: FLOPs, and the
bytes it allocates beyond its outputs (its workspace: temporaries ATen makes inside the call).

Both are rough upper bounds, declared per layer kind next to what the meanings in `ir/reference.py` call; the
engine loader sums them against its ceilings (`runtime/limits.py`), on shapes alone. FLOPs: a product counts
2*M*N*K, a convolution 2 per multiply-add, attention its two products, pooling and resampling their taps, any
other kind the elements it reads and writes. Workspace is the path ATen may take that allocates most (for
attention, the math path's scores, whatever the device would pick); a kind without an entry allocates only
its outputs.
"""
from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterable

import torch

from torchkiln.ir import layers as L
from torchkiln.ir.symbolic import Dim, bounds
from torchkiln.ir.tensor import Tensor

Cost = Callable[[L.Layer], float]
FLOPS: dict[type[L.Layer], Cost] = {}
WORKSPACE: dict[type[L.Layer], Cost] = {}
_INT32_ELEMENTS = 1 << 31  # past this, ATen's oneDNN/cuDNN convolutions fall back to im2col (64-bit indexing)


def flops(layer: L.Layer) -> float:
    """The layer's FLOPs at its largest shapes (inf where a dim has no known bound)."""
    return FLOPS.get(type(layer), _touched)(layer)


def workspace_bytes(layer: L.Layer) -> float:
    """The most bytes the layer's meaning may allocate at once besides its outputs, at its largest shapes."""
    found = WORKSPACE.get(type(layer))
    return 0.0 if found is None else found(layer)


def declare(table: dict[type[L.Layer], Cost], *kinds: type[L.Layer]) -> Callable[[Cost], Cost]:
    def register(fn: Cost) -> Cost:
        for kind in kinds:
            table[kind] = fn
        return fn

    return register


@functools.lru_cache(maxsize=4096)
def _hi(d: Dim) -> float:
    """A dim at its largest."""
    return float(d) if isinstance(d, int) else float(bounds(d)[1])


def size(dims: Iterable[Dim]) -> float:
    """The product of dims at their largest."""
    return _product([_hi(d) for d in dims])


def _product(extents: list[float]) -> float:
    """0 where an extent is 0 (inf times 0 is no size)."""
    return 0.0 if any(e <= 0 for e in extents) else math.prod(extents)


def numel(t: Tensor) -> float:
    return size(t.shape)


def nbytes(t: Tensor) -> float:
    return numel(t) * t.dtype.itemsize


def _touched(layer: L.Layer) -> float:
    """Elements read and written: the cost of a kind that does a few operations per element."""
    return sum(numel(t) for t in layer.inputs) + sum(numel(t) for t in layer.outputs)


def _last(t: Tensor, n: int) -> float:
    """The product of the last n dims (fewer where the tensor has fewer)."""
    return size(t.shape[-n:]) if t.rank else 1.0


# ---- FLOPs ---------------------------------------------------------------------------------------------

@declare(FLOPS, L.ConstantLayer)
def _free(layer: L.Layer) -> float:
    return 0.0


@declare(FLOPS, L.ShapeLayer)
def _written(layer: L.Layer) -> float:
    return sum(numel(t) for t in layer.outputs)


@declare(FLOPS, L.ConvolutionLayer)
def _convolution_flops(layer: L.ConvolutionLayer) -> float:
    kernel = layer.weights["kernel"]
    taps = kernel.shape[1] * math.prod(kernel.shape[2:])  # per output (per input, transposed) element
    x, y = layer.inputs[0], layer.outputs[0]
    return 2 * numel(x if layer.transposed else y) * taps + numel(y)


def _contracted(layer: L.MatrixMultiplyLayer) -> float:
    """K of the product."""
    a = layer.inputs[0]
    if a.rank >= 2 and layer.op0 == L.MatrixOperation.TRANSPOSE:
        return _hi(a.shape[-2])
    return _hi(a.shape[-1]) if a.rank else 1.0


@declare(FLOPS, L.MatrixMultiplyLayer)
def _matmul_flops(layer: L.MatrixMultiplyLayer) -> float:
    out = numel(layer.outputs[0])
    return 2 * out * _contracted(layer) + out


def einsum_extents(equation: str, operands: list[Tensor]) -> float:
    """The product of every index's extent, the dims '...' stands for broadcast once: the size of the
    contraction's iteration space."""
    terms = equation.replace(" ", "").split("->")[0].split(",")
    extent: dict[str, float] = {}
    ellipses: list[list[float]] = []
    for term, t in zip(terms, operands):
        dims = [_hi(d) for d in t.shape]
        before, _, after = term.partition("...")
        tail = len(dims) - len(after) if "..." in term else len(dims)
        if "..." in term:
            ellipses.append(dims[len(before):tail])
        for letter, d in zip(before + after, dims[:len(before)] + dims[tail:]):
            extent[letter] = max(extent.get(letter, 1.0), d)
    width = max((len(e) for e in ellipses), default=0)
    broadcast = [max([1.0] + [e[i - width + len(e)] for e in ellipses if i - width + len(e) >= 0])
                 for i in range(width)]
    return _product(list(extent.values()) + broadcast)


@declare(FLOPS, L.EinsumLayer)
def _einsum_flops(layer: L.EinsumLayer) -> float:
    return 2 * einsum_extents(layer.equation, layer.inputs) * max(1, len(layer.inputs) - 1)


def _attention_sizes(layer: L.AttentionLayer) -> tuple[float, float, float]:
    """(query rows over every batch dim and head, key length S, query length L)."""
    k, y = layer.inputs[1], layer.outputs[0]
    rows = size(y.shape[:-1]) if y.rank else 1.0
    keys = _hi(k.shape[-2]) if k.rank >= 2 else 1.0
    length = _hi(y.shape[-2]) if y.rank >= 2 else 1.0
    return rows, keys, length


@declare(FLOPS, L.AttentionLayer)
def _attention_flops(layer: L.AttentionLayer) -> float:
    q, v = layer.inputs[0], layer.inputs[2]
    rows, keys, _ = _attention_sizes(layer)
    head = (_last(q, 1) + _last(v, 1))
    return rows * keys * (2 * head + 5) + _touched(layer)


@declare(FLOPS, L.PoolingLayer)
def _pooling_flops(layer: L.PoolingLayer) -> float:
    return numel(layer.outputs[0]) * size(layer.window) + numel(layer.inputs[0])


@declare(FLOPS, L.ResizeLayer, L.GridSampleLayer)
def _sampling_flops(layer: L.Layer) -> float:
    return 16 * numel(layer.outputs[0]) + _touched(layer)  # up to 4x4 taps (bicubic), 2x2x2 (trilinear)


@declare(FLOPS, L.TopKLayer)
def _topk_flops(layer: L.TopKLayer) -> float:
    return numel(layer.inputs[0]) * (1 + math.log2(max(_hi(layer.k), 1.0) + 1)) + _touched(layer)


# ---- workspace -----------------------------------------------------------------------------------------

@declare(WORKSPACE, L.FillLayer)
def _fill_workspace(layer: L.FillLayer) -> float:
    return 3 * 8 * max(_hi(layer.length), 0.0)  # float64 index, index * step, + start


@declare(WORKSPACE, L.SliceLayer)
def _slice_workspace(layer: L.SliceLayer) -> float:
    """A negative step is an index_select along its dim (copying every other dim whole) with an int64 index."""
    x = layer.inputs[0]
    dims = [_hi(d) for d in x.shape]
    total = 0.0
    for d, (count, step) in enumerate(zip(layer.shape, layer.stride)):
        if bounds(step)[0] < 0 and d < len(dims):
            dims[d] = _hi(count)
            total += _product(dims) * x.dtype.itemsize + 8 * max(dims[d], 0.0)
    return total


@declare(WORKSPACE, L.AttentionLayer)
def _attention_workspace(layer: L.AttentionLayer) -> float:
    """The math path: scores and their softmax (at least float32), the scaled and made-contiguous operands, a
    boolean or causal mask made additive."""
    rows, keys, length = _attention_sizes(layer)
    width = max(layer.inputs[0].dtype.itemsize, 4)
    mask = numel(layer.inputs[3]) if len(layer.inputs) > 3 else 0.0
    causal = length * keys * (1 + width) if layer.causal else 0.0
    return width * (3 * rows * keys + mask) + causal + sum(nbytes(t) for t in layer.inputs[:3])


@declare(WORKSPACE, L.ConvolutionLayer)
def _convolution_workspace(layer: L.ConvolutionLayer) -> float:
    """oneDNN and cuDNN take float32 with reordered copies of input and output; ATen's im2col kernels (float64,
    half precision where the CPU has no native kernels, 64-bit indexing) unfold the whole batch: for every
    output (input, transposed) position, every input (output) channel times the kernel's taps."""
    kernel = layer.weights["kernel"]
    x, y = layer.inputs[0], layer.outputs[0]
    if x.dtype == torch.float32 and max(numel(x), numel(y)) < _INT32_ELEMENTS:
        return 2 * (nbytes(x) + nbytes(y))
    taps = math.prod(kernel.shape[2:])
    channels_in = kernel.shape[0] if layer.transposed else kernel.shape[1] * layer.groups
    channels_out = kernel.shape[1] * layer.groups if layer.transposed else kernel.shape[0]
    # positions: the elements of the side that is not unfolded, per channel of that side
    unfolded, per = (x, channels_in) if layer.transposed else (y, channels_out)
    positions = numel(unfolded) / per if per else 0.0
    other = channels_out if layer.transposed else channels_in
    return 1.5 * positions * other * taps * x.dtype.itemsize


@declare(WORKSPACE, L.MatrixMultiplyLayer)
def _matmul_workspace(layer: L.MatrixMultiplyLayer) -> float:
    """A 2-d right operand folds the left one into one GEMM (a contiguous copy of it at most); a batched product
    expands both operands to the broadcast batch; a bias is added to a temporary product."""
    a, b = layer.inputs
    y = layer.outputs[0]
    bias = nbytes(y) if "bias" in layer.weights else 0.0
    if b.rank <= 2:
        return nbytes(a) + bias
    batch = size(y.shape[:-2])
    return batch * (_last(a, 2) * a.dtype.itemsize + _last(b, 2) * b.dtype.itemsize) + bias


@declare(WORKSPACE, L.EinsumLayer)
def _einsum_workspace(layer: L.EinsumLayer) -> float:
    """Operands permuted into GEMMs, and with three or more, intermediate products (each within the extents)."""
    copies = sum(nbytes(t) for t in layer.inputs) + nbytes(layer.outputs[0])
    chained = max(len(layer.inputs) - 2, 0) * einsum_extents(layer.equation, layer.inputs)
    return copies + chained * layer.outputs[0].dtype.itemsize


@declare(WORKSPACE, L.ResizeLayer)
def _resize_workspace(layer: L.ResizeLayer) -> float:
    """Per resized dim, an index and weight table per output position and tap; integer images are resampled
    through float32 buffers."""
    x, y = layer.inputs[0], layer.outputs[0]
    tables = 64 * sum(_hi(d) for d in y.shape[2:])
    return tables + (0.0 if x.dtype.is_floating_point else 8 * numel(y))


@declare(WORKSPACE, L.PoolingLayer)
def _pooling_workspace(layer: L.PoolingLayer) -> float:
    return 8 * numel(layer.outputs[0]) if layer.type == L.PoolingType.MAX else 0.0  # int64 argmax indices


@declare(WORKSPACE, L.SoftMaxLayer, L.NormalizationLayer)
def _upcast_workspace(layer: L.Layer) -> float:
    """Half precision is computed in float32 (a copy of the input and a float32 result); otherwise a contiguous
    copy of the input at most."""
    x = layer.inputs[0]
    return 2 * numel(x) * max(x.dtype.itemsize, 4)


@declare(WORKSPACE, L.ScaleLayer)
def _scale_workspace(layer: L.ScaleLayer) -> float:
    return 2 * nbytes(layer.outputs[0])  # x * scale, + shift, then ** power


@declare(WORKSPACE, L.ElementWiseLayer, L.UnaryLayer, L.ActivationLayer, L.SelectLayer, L.ParametricReLULayer)
def _promotion_workspace(layer: L.Layer) -> float:
    """ATen's CPU loops cast an operand of another dtype than the computation's into a copy first."""
    dtypes = [t.dtype for t in layer.inputs] + [t.dtype for t in layer.outputs if t.dtype != torch.bool]
    common = functools.reduce(torch.promote_types, dtypes)
    return sum(numel(t) * common.itemsize for t in layer.inputs if t.dtype != common)


@declare(WORKSPACE, L.PaddingLayer)
def _padding_workspace(layer: L.PaddingLayer) -> float:
    return 0.0 if layer.mode == L.PaddingMode.CONSTANT else nbytes(layer.outputs[0])  # circular: cat of slices


@declare(WORKSPACE, L.ReduceLayer)
def _reduce_workspace(layer: L.ReduceLayer) -> float:
    """A product reduces one axis at a time (intermediates within the input); others keep a float accumulator."""
    if layer.op == L.ReduceOperation.PROD and len(layer.axes) > 1:
        return nbytes(layer.inputs[0])
    return 8 * numel(layer.outputs[0])


@declare(WORKSPACE, L.GatherLayer)
def _gather_workspace(layer: L.GatherLayer) -> float:
    indices = layer.inputs[1]
    return numel(indices) * (3 + indices.dtype.itemsize)  # the range check's masks, a flattened copy


@declare(WORKSPACE, L.TopKLayer)
def _topk_workspace(layer: L.TopKLayer) -> float:
    x = layer.inputs[0]
    return numel(x) * (x.dtype.itemsize + 8)  # values and int64 indices of a full sort


@declare(FLOPS, L.UniqueLayer)
def _unique_flops(layer: L.UniqueLayer) -> float:
    return numel(layer.inputs[0]) * (1 + math.log2(numel(layer.inputs[0]) + 1)) + _touched(layer)  # a sort


@declare(WORKSPACE, L.UniqueLayer)
def _unique_workspace(layer: L.UniqueLayer) -> float:
    x = layer.inputs[0]
    return numel(x) * (x.dtype.itemsize + 16)  # sorted values, their permutation and a scan of run starts


# ---- control flow: what its sub-networks cost --------------------------------------------------------------

def network_flops(network) -> float:
    """A (sub-)network's FLOPs: its layers' sum."""
    return sum(flops(layer) for layer in network.layers)


def network_bytes(network) -> float:
    """What running a sub-network may hold at once, bounded above by every tensor it makes and its layers'
    largest workspace together."""
    made = sum(nbytes(t) for layer in network.layers if not isinstance(layer, L.ConstantLayer) for t in layer.outputs)
    weights = sum(w.numel() * w.element_size() for layer in network.layers for w in layer.weights.values())
    return made + weights + max((workspace_bytes(layer) for layer in network.layers), default=0.0)


@declare(FLOPS, L.ConditionalLayer)
def _conditional_flops(layer: L.ConditionalLayer) -> float:
    return max(network_flops(layer.then_branch), network_flops(layer.else_branch))


@declare(FLOPS, L.LoopLayer)
def _loop_flops(layer: L.LoopLayer) -> float:
    """Every iteration it may run (at most max_trips), the body and the copy of what it carries."""
    carried = sum(numel(t) for t in layer.outputs)
    return layer.max_trips * (network_flops(layer.body) + carried + 1)


@declare(WORKSPACE, L.ConditionalLayer)
def _conditional_workspace(layer: L.ConditionalLayer) -> float:
    return max(network_bytes(layer.then_branch), network_bytes(layer.else_branch))


@declare(WORKSPACE, L.LoopLayer)
def _loop_workspace(layer: L.LoopLayer) -> float:
    return network_bytes(layer.body)  # an iteration's tensors are dropped when the next one starts
