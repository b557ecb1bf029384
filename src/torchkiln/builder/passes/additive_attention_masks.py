"""A boolean attention mask read by attention layers becomes, once, the additive float mask SDPA makes of it.

scaled_dot_product_attention turns a boolean mask into `where(mask, 0, -inf)` in the query's dtype on every call
(kernels that fill a tensor of zeros and write -inf where the mask is False), so a 12-layer encoder converts the
same mask 12 times. Converting it once, with a select layer placed before the first attention layer that reads it,
gives every layer exactly the mask SDPA would have made: the same values, once.
"""
from __future__ import annotations

import torch

from torchkiln.builder.settings import BuildSettings
from torchkiln.ir import layers as L
from torchkiln.ir.network import Network
from torchkiln.ir.tensor import Tensor


def additive_attention_masks(network: Network, settings: BuildSettings) -> bool:
    made: dict[tuple[int, torch.dtype], Tensor] = {}
    order: list[L.Layer] = []
    for layer in list(network.layers):
        if isinstance(layer, L.AttentionLayer) and len(layer.inputs) == 4 and layer.inputs[3].dtype == torch.bool:
            mask, dtype = layer.inputs[3], layer.inputs[0].dtype
            key = (id(mask), dtype)
            if key not in made:
                zero = network.add_constant(torch.zeros((), dtype=dtype), name=f"{layer.name}/mask_zero")
                blocked = network.add_constant(torch.full((), float("-inf"), dtype=dtype),
                                               name=f"{layer.name}/mask_blocked")
                select = network.add_select(mask, zero.get_output(), blocked.get_output())
                order += [zero, blocked, select]
                made[key] = select.get_output()
            layer.inputs = [*layer.inputs[:3], made[key]]
        order.append(layer)
    if made:
        network.layers = order
    return bool(made)
