"""Replace layers whose inputs are all constants by the constants they compute."""
from __future__ import annotations

import torch

from torchkiln.builder.settings import BuildSettings
from torchkiln.ir import layers as L
from torchkiln.ir.network import Network
from torchkiln.ir.symbolic import has_symbols
from torchkiln.ir.reference import run_layer

_CPU = torch.device("cpu")


def fold_constants(network: Network, settings: BuildSettings) -> bool:
    changed = False
    for layer in list(network.layers):
        if isinstance(layer, L.ConstantLayer):
            continue
        if not all(t.producer is not None and isinstance(t.producer, L.ConstantLayer) for t in layer.inputs):
            continue
        if has_symbols([t.shape for t in layer.outputs] + list(layer.params().values())):  # dynamic shapes
            continue
        size = sum(torch.Size(t.shape).numel() for t in layer.outputs)
        if size > settings.max_folded_elements:
            continue
        values = run_layer(layer, [t.producer.weights["value"] for t in layer.inputs],
                           layer.weights, _CPU)
        for out, value in zip(layer.outputs, values):
            const = network.add_constant(value.contiguous(), name=f"{layer.name}.folded")
            network.move_before(const, layer)
            network.replace_all_uses(out, const.get_output())
        network.remove_layers({id(layer)})
        changed = True
    return changed
