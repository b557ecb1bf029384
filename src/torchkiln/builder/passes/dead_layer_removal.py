"""Remove layers that no network output depends on."""
from __future__ import annotations

from torchkiln.builder.settings import BuildSettings
from torchkiln.ir.network import Network


def remove_dead_layers(network: Network, settings: BuildSettings) -> bool:
    live: set[int] = set()
    stack = [t.producer for t in network.outputs if t.producer is not None]
    while stack:
        layer = stack.pop()
        if id(layer) in live:
            continue
        live.add(id(layer))
        stack.extend(t.producer for t in layer.inputs if t.producer is not None)
    dead = {id(layer) for layer in network.layers if id(layer) not in live}
    network.remove_layers(dead)
    return bool(dead)
