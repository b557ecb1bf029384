"""Output shapes and dtypes of a layer, by running its reference meaning on meta tensors.

Meta tensors carry no values, so a layer's outputs depend only on its kind, its parameters and the
shapes and dtypes of its inputs and weights. Results are kept by that signature, so a network of many
alike layers (an engine of 400,000 unary layers) runs the meaning once per distinct signature; the
meaning stays the single source of truth. Pointwise, reduce and matrix multiply layers run it on CPU tensors with
no elements instead, their output shape given by a rule that run checks (`_infer_on_empty`): on meta tensors torch
runs them through its Python references, whose first call imports torch._dynamo (half a second of a compile).
Group and layer normalizations and attention, whose meta kernels are such references too, have their outputs from
rules that hold wherever the rules' own checks pass (`_RULES`); meta decides the rest.
"""
from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

import torch

from torchkiln.errors import NetworkError
from torchkiln.ir.layers import (ActivationLayer, AttentionLayer, ElementWiseLayer, Layer, MatrixMultiplyLayer,
                                 MatrixOperation, NormalizationKind, NormalizationLayer, ReduceLayer, UnaryLayer)
from torchkiln.ir.symbolic_shapes import any_symbolic, infer_symbolic

Outputs = tuple[tuple[tuple[int, ...], torch.dtype], ...]
CACHE_SIZE = 4096
_cache: dict[tuple, Outputs] = {}
_lock = threading.Lock()


def signature(layer: Layer) -> tuple:
    """Everything the meta-tensor meaning of `layer` can see."""
    weights = layer.weights
    return (type(layer), tuple([getattr(layer, name) for name in layer.param_names()]),
            tuple([(t.shape, t.dtype) for t in layer.inputs]),
            tuple(sorted((k, tuple(w.shape), w.dtype) for k, w in weights.items())) if weights else ())


def infer_outputs(layer: Layer) -> list[tuple[tuple[int, ...], torch.dtype]]:
    """The layer's output (shape, dtype) pairs; a layer that rejects its inputs is a NetworkError."""
    from torchkiln.ir.reference import run_layer

    if layer.SUBNETWORKS:  # control flow: what its sub-networks give (their own layers were inferred)
        return list(layer.result_types())
    symbolic = any_symbolic(layer, layer.inputs)  # dynamic shapes: symbolic inference (ir/symbolic_shapes.py)
    key: tuple | None = signature(layer)  # symbols are told apart by identity, so a key holds their ranges
    try:
        found = _cache.get(key)
    except TypeError:  # an unhashable parameter value: no caching
        key = found = None
    if found is None:
        found = tuple(infer_symbolic(layer, run_layer)) if symbolic else infer_on_meta(layer)
        if key is not None:
            with _lock:
                if len(_cache) >= CACHE_SIZE:
                    _cache.clear()
                _cache[key] = found
    return list(found)


def _broadcast(layer: Layer) -> tuple[int, ...]:
    return tuple(torch.broadcast_shapes(*[t.shape for t in layer.inputs]))


def _reduced(layer: ReduceLayer) -> tuple[int, ...]:
    shape = layer.inputs[0].shape
    axes = {a % len(shape) for a in layer.axes}
    return tuple(1 if i in axes else d for i, d in enumerate(shape) if layer.keep_dims or i not in axes)


def _matrix_product(layer: MatrixMultiplyLayer) -> tuple[int, ...]:
    """Inputs of rank 2 or more: the broadcast batch dims, then rows of the first and columns of the second (each
    transposed as the layer says), broadcast with the bias; ValueError for anything else (meta decides)."""
    a, b = (list(t.shape) for t in layer.inputs)
    if len(a) < 2 or len(b) < 2:
        raise ValueError("a vector operand")
    for shape, op in ((a, layer.op0), (b, layer.op1)):
        if op == MatrixOperation.TRANSPOSE:
            shape[-1], shape[-2] = shape[-2], shape[-1]
        elif op != MatrixOperation.NONE:
            raise ValueError(f"operation {op}")
    if a[-1] != b[-2]:
        raise ValueError("inner dims differ")
    shape = (*torch.broadcast_shapes(a[:-2], b[:-2]), a[-2], b[-1])
    bias = layer.weights.get("bias")
    return shape if bias is None else tuple(torch.broadcast_shapes(shape, bias.shape))


# Layer kinds whose output shape follows from their input shapes alone: on meta tensors torch runs them through its
# Python references, whose first call imports torch._dynamo (half a second of a compile). Their output dtype comes
# from their meaning run on CPU tensors with no elements instead (`_infer_on_empty`).
_SHAPE_RULES: dict[type[Layer], Callable[[Any], tuple[int, ...]]] = {
    ActivationLayer: _broadcast, ElementWiseLayer: _broadcast, UnaryLayer: _broadcast, ReduceLayer: _reduced,
    MatrixMultiplyLayer: _matrix_product}


def _normalized(layer: NormalizationLayer) -> Outputs | None:
    """A group or layer normalization's output, its input's shape and dtype, where its meaning accepts its input
    (the layer's validation checked groups and weights); None otherwise."""
    x = layer.inputs[0]
    normalized = tuple(layer.normalized_shape)
    if not x.dtype.is_floating_point or layer.kind not in (NormalizationKind.GROUP, NormalizationKind.LAYER):
        return None
    if layer.kind == NormalizationKind.LAYER and not (
            normalized and len(normalized) <= x.rank and tuple(x.shape[x.rank - len(normalized):]) == normalized):
        return None
    return ((tuple(x.shape), x.dtype),)


def _attended(layer: AttentionLayer) -> Outputs | None:
    """Attention's output, [*batch, L, Ev] of the query's dtype, for query [*batch, L, E], key [*batch', S, E] and
    value [*batch', S, Ev] of one floating dtype and rank 3 or more, where batch' is batch (or, with `enable_gqa`,
    batch with a number of heads, dim -3, that divides the query's), and a mask of bools or that dtype broadcasts
    to [*batch, L, S]; None otherwise."""
    q, k, v = (t.shape for t in layer.inputs[:3])
    dtype = layer.inputs[0].dtype
    if not dtype.is_floating_point or any(t.dtype != dtype for t in layer.inputs[1:3]):
        return None
    if not (len(q) == len(k) == len(v) >= 3 and q[-1] == k[-1] and k[-2] == v[-2] and k[:-2] == v[:-2]):
        return None
    if layer.enable_gqa:
        if q[:-3] != k[:-3] or not (k[-3] >= 1 and q[-3] % k[-3] == 0):
            return None
    elif q[:-2] != k[:-2]:
        return None
    if len(layer.inputs) > 3:
        mask = layer.inputs[3]
        if mask.dtype not in (torch.bool, dtype) or mask.rank > len(q):
            return None
        try:
            if tuple(torch.broadcast_shapes(mask.shape, (*q[:-1], k[-2]))) != (*q[:-1], k[-2]):
                return None
        except RuntimeError:
            return None
    return (((*q[:-1], v[-1]), dtype),)


def _emptied(shape: Sequence[int]) -> list[int]:
    """A shape with no elements that broadcasts and reduces as `shape` does: each dim of 1 kept, the others 0."""
    return [1 if d == 1 else 0 for d in shape]


def _infer_on_empty(layer: Layer) -> Outputs | None:
    """The output of a layer kind with a shape rule: the rule's shape, and the dtype its meaning gives on CPU
    tensors of the inputs' ranks and dtypes with no elements, where that run gives the rule's shape emptied;
    None otherwise (shapes the rule refuses, dtypes the CPU kernel refuses: meta decides, and reports the error)."""
    from torchkiln.ir.reference import run_layer

    try:
        shape = _SHAPE_RULES[type(layer)](layer)
        inputs = [torch.zeros(_emptied(t.shape), dtype=t.dtype) for t in layer.inputs]  # 0-d: a value
        weights = {k: torch.zeros(_emptied(w.shape), dtype=w.dtype) for k, w in layer.weights.items()}
        outs = run_layer(layer, inputs, weights, torch.device("cpu"))
    except Exception:  # the rule's or the CPU kernel's own checks; meta's are the ones that count
        return None
    if len(outs) != 1 or list(outs[0].shape) != _emptied(shape):
        return None
    return ((shape, outs[0].dtype),)


# A kind's outputs without meta tensors, where its rule's checks pass (None: meta decides, and reports any error)
_RULES: dict[type[Layer], Callable[[Any], Outputs | None]] = {
    **{kind: _infer_on_empty for kind in _SHAPE_RULES}, NormalizationLayer: _normalized, AttentionLayer: _attended}


def infer_on_meta(layer: Layer) -> Outputs:
    """Run the layer's meaning on meta tensors (no memory is allocated for any shape), unless its kind's rule gives
    its outputs (`_RULES`)."""
    from torchkiln.ir.reference import run_layer

    rule = _RULES.get(type(layer))
    if rule is not None:
        found = rule(layer)
        if found is not None:
            return found
    meta = torch.device("meta")
    try:
        inputs = [torch.empty(t.shape, dtype=t.dtype, device=meta) for t in layer.inputs]
        weights = {k: w.to(meta) for k, w in layer.weights.items()}
        outs = run_layer(layer, inputs, weights, meta)
    except NetworkError:
        raise
    except Exception as e:  # the meaning's own check of shapes, dtypes or parameters
        shapes = ", ".join(f"{t.name}{list(t.shape)}:{str(t.dtype).removeprefix('torch.')}" for t in layer.inputs)
        raise NetworkError(f"{layer.KIND} layer {layer.name!r} rejects inputs ({shapes}) "
                           f"with params {layer.params()}: {e}") from e
    return tuple((tuple(o.shape), o.dtype) for o in outs)
