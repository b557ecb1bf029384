"""Output shapes and dtypes of a layer, by running its reference meaning on meta tensors."""
from __future__ import annotations

import torch

from torchkiln.errors import NetworkError
from torchkiln.network.layers import Layer
from torchkiln.network.symbolic_shapes import any_symbolic, infer_symbolic


def infer_outputs(layer: Layer) -> list[tuple[tuple[int, ...], torch.dtype]]:
    """Run the layer's meaning on meta tensors; a layer that rejects its inputs is a NetworkError."""
    from torchkiln.runtime.reference import run_layer

    n = len(layer.inputs)
    if n < layer.MIN_INPUTS or (layer.MAX_INPUTS is not None and n > layer.MAX_INPUTS):
        raise NetworkError(f"{layer.KIND} layer {layer.name!r} got {n} inputs")
    missing = [w for w in layer.REQUIRED_WEIGHTS if w not in layer.weights]
    unknown = [w for w in layer.weights if w not in layer.WEIGHTS]
    if missing or unknown:
        raise NetworkError(f"{layer.KIND} layer {layer.name!r}: missing weights {missing}, unknown weights {unknown}")
    if any_symbolic(layer, layer.inputs):  # dynamic shapes: symbolic inference (network/symbolic_shapes.py)
        return infer_symbolic(layer, run_layer)
    meta = torch.device("meta")
    inputs = [torch.empty(t.shape, dtype=t.dtype, device=meta) for t in layer.inputs]
    weights = {k: w.to(meta) for k, w in layer.weights.items()}
    try:
        outs = run_layer(layer, inputs, weights, meta)
    except NetworkError:
        raise
    except Exception as e:  # the meaning's own check of shapes, dtypes or parameters
        shapes = ", ".join(f"{t.name}{list(t.shape)}:{str(t.dtype).removeprefix('torch.')}" for t in layer.inputs)
        raise NetworkError(f"{layer.KIND} layer {layer.name!r} rejects inputs ({shapes}) "
                           f"with params {layer.params()}: {e}") from e
    return [(tuple(o.shape), o.dtype) for o in outs]
