"""Run float layers in the engine's compute precision; keep input and output dtypes as declared."""
from __future__ import annotations

import torch

from torchkiln.builder.passes import build_pass
from torchkiln.builder.settings import BuildSettings
from torchkiln.network import layers as L
from torchkiln.network.network import Network


@build_pass(order=50)
def lower_precision(network: Network, settings: BuildSettings) -> bool:
    low = settings.compute_dtype
    if low == torch.float32:
        return False
    declared = [t.dtype for t in network.outputs]
    first = network.layers[0] if network.layers else None
    for t in network.inputs:
        if t.dtype == torch.float32:
            cast = network.add_cast(t, low)
            network.replace_all_uses(t, cast.get_output())
            cast.inputs = [t]
            network.move_before(cast, first)
    for layer in network.layers:
        layer.weights = {k: w.to(low) if w.dtype == torch.float32 else w for k, w in layer.weights.items()}
        if isinstance(layer, L.CastLayer) and layer.to_type == torch.float32:
            layer.to_type = low
        if isinstance(layer, L.FillLayer) and layer.dtype == torch.float32:
            layer.dtype = low
    network.reinfer()
    for i, (t, dtype) in enumerate(zip(list(network.outputs), declared)):
        if t.dtype != dtype:
            network.outputs[i] = network.add_cast(t, dtype).get_output()
    return True
