"""Key and value heads repeated for grouped-query attention are read by the attention layer as they are.

A model with fewer key/value heads (G) than query heads (H) repeats each key/value head H / G times before
attention, written `x[:, :, None].expand(B, G, H / G, S, E).reshape(B, H, S, E)` (transformers' `repeat_kv`). The
reshape of an expanded tensor is a copy: two tensors of H heads written and read again, per layer. SDPA with
`enable_gqa` reads head h of the query against key/value head h // (H / G), the same values, so the attention
layer reads the G heads directly and the copies go when nothing else reads them. The match: a reshape (no
transposes) of [B, G, R, S, E] to [B, G * R, S, E], of an expand of a size-1 dim 2, of a reshape (no transposes)
adding that dim to [B, G, S, E]; for key and value with the same R.
"""
from __future__ import annotations

import logging

from torchkiln.builder.settings import BuildSettings
from torchkiln.ir import layers as L
from torchkiln.ir.network import Network
from torchkiln.ir.tensor import Tensor

logger = logging.getLogger("torchkiln.builder")


def grouped_query_attention(network: Network, settings: BuildSettings) -> bool:
    changed = False
    for layer in network.layers:
        if not isinstance(layer, L.AttentionLayer) or layer.enable_gqa or layer.inputs[0].rank != 4:
            continue
        q, k, v = layer.inputs[:3]
        (k_heads, k_repeat), (v_heads, v_repeat) = _repeated(k), _repeated(v)
        if k_heads is None or v_heads is None or k_repeat != v_repeat:
            logger.debug("attention %r reads no repeated key/value heads: %s", layer.name,
                         k_repeat if k_heads is None else v_repeat if v_heads is None else "repeated differently")
            continue
        layer.inputs = [q, k_heads, v_heads, *layer.inputs[3:]]
        layer.enable_gqa = True
        changed = True
    return changed


def _pure_reshape(t: Tensor) -> Tensor | None:
    """The input of the shuffle making `t` if it only reshapes (no transposes), else None."""
    shuffle = t.producer
    if not isinstance(shuffle, L.ShuffleLayer):
        return None
    for perm in (shuffle.first_transpose, shuffle.second_transpose):
        if perm is not None and tuple(perm) != tuple(range(len(perm))):
            return None
    return shuffle.inputs[0]


def _repeated(t: Tensor) -> tuple[Tensor | None, object]:
    """(x, R) where `t` [B, G * R, S, E] repeats each head of x [B, G, S, E] R times in a row; else (None, why)."""
    grouped = _pure_reshape(t)
    if grouped is None or grouped.rank != 5 or not isinstance(grouped.producer, L.ExpandLayer):
        return None, f"{t.name} is not a reshape of an expanded 5-D tensor"
    b, g, r, s, e = grouped.shape
    if tuple(t.shape) != (b, g * r, s, e) or not isinstance(r, int):
        return None, f"{t.name} {list(t.shape)} does not merge dims 1 and 2 of {list(grouped.shape)}"
    unit = grouped.producer.inputs[0]
    if tuple(unit.shape) != (b, g, 1, s, e):
        return None, f"the expand reads {list(unit.shape)}, not {[b, g, 1, s, e]}"
    heads = _pure_reshape(unit)
    if heads is None or tuple(heads.shape) != (b, g, s, e):
        return None, f"{unit.name} is not a reshape of a [{b}, {g}, {s}, {e}] tensor"
    return heads, r
