"""Output shapes and dtypes of a layer, by running its reference meaning on meta tensors.

Meta tensors carry no values, so a layer's outputs depend only on its kind, its parameters and the
shapes and dtypes of its inputs and weights. Results are kept by that signature, so a network of many
alike layers (an engine of 400,000 unary layers) runs the meaning once per distinct signature; the
meaning stays the single source of truth.
"""
from __future__ import annotations

import threading

import torch

from torchkiln.errors import NetworkError
from torchkiln.ir.layers import Layer
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


def infer_on_meta(layer: Layer) -> Outputs:
    """Run the layer's meaning on meta tensors (no memory is allocated for any shape)."""
    from torchkiln.ir.reference import run_layer

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
