"""Drop layers that pass their input through unchanged (identity, same-dtype cast, no-op shuffle)."""
from __future__ import annotations

from torchkiln.builder.settings import BuildSettings
from torchkiln.ir import layers as L
from torchkiln.ir.network import Network


def _is_noop(layer: L.Layer) -> bool:
    if isinstance(layer, L.IdentityLayer):
        return True
    same_shape = layer.outputs[0].shape == layer.inputs[0].shape if layer.inputs else False
    if isinstance(layer, L.CastLayer):
        return layer.to_type == layer.inputs[0].dtype
    if isinstance(layer, L.ShuffleLayer):
        def identity(perm):
            return perm is None or tuple(perm) == tuple(range(len(perm)))
        return same_shape and identity(layer.first_transpose) and identity(layer.second_transpose)
    if isinstance(layer, L.ExpandLayer):
        return same_shape
    if isinstance(layer, L.SliceLayer):
        return same_shape and all(s == 0 for s in layer.start) and all(s == 1 for s in layer.stride)
    return False


def eliminate_identities(network: Network, settings: BuildSettings) -> bool:
    changed = False
    for layer in list(network.layers):
        out = layer.outputs[0] if layer.outputs else None
        if out is None or out in network.outputs or not _is_noop(layer):
            continue
        network.replace_all_uses(out, layer.inputs[0])
        network.remove_layers({id(layer)})
        changed = True
    return changed
