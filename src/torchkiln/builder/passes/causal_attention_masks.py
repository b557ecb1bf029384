"""A constant attention mask that is the causal mask becomes the attention layer's `causal` flag.

Models often build the causal mask themselves (a lower-triangular [L, S] boolean, or 0 and -inf added), and with
static shapes it folds to a constant. SDPA's fused kernels that skip the blocked half of the scores (flash
attention) refuse an explicit mask, and every kernel reads it from memory. With L == S, `is_causal=True` is the
same mask (query i sees keys 0..i), so the layer drops the mask input and sets the flag. A float mask qualifies only
if its values are 0 and -inf (what a boolean mask means); any other value changes the scores.
"""
from __future__ import annotations

import torch

from torchkiln.builder.settings import BuildSettings
from torchkiln.ir import layers as L
from torchkiln.ir.network import Network


def causal_attention_masks(network: Network, settings: BuildSettings) -> bool:
    changed = False
    for layer in network.layers:
        if isinstance(layer, L.AttentionLayer) and len(layer.inputs) == 4 and not layer.causal \
                and _is_causal(layer):
            layer.inputs = layer.inputs[:3]
            layer.causal = True
            changed = True
    return changed


def _is_causal(layer: L.AttentionLayer) -> bool:
    q, k, mask = layer.inputs[0], layer.inputs[1], layer.inputs[3]
    value = L.constant_value(mask)
    length, keys = q.shape[-2] if q.rank >= 2 else None, k.shape[-2] if k.rank >= 2 else None
    if value is None or not isinstance(length, int) or length != keys or value.dim() < 2 \
            or tuple(value.shape[-2:]) != (length, keys):
        return False
    if value.dtype == torch.bool:
        keep = value
    elif value.is_floating_point() and bool(((value == 0) | (value == float("-inf"))).all()):
        keep = value == 0
    else:
        return False
    return torch.equal(keep, torch.ones(length, keys, dtype=torch.bool).tril().expand(keep.shape))
