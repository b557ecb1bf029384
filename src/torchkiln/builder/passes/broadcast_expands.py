"""Let broadcasting layers read an expand's input: `x / norm.expand_as(x)` (F.normalize writes it so) is `x / norm`.

An elementwise or select layer broadcasts its operands numpy-style, so reading an expand layer's output gives the
same values as reading its input wherever another operand of the layer already has every dim the expand makes, at
the same size: the layer's output shape is then unchanged too. Where that holds for a reader, it reads the expand's
input instead; an expand no one reads any more is dead. Exact (no value is computed differently), and it leaves
the fusion rules a row value broadcast over its row (a norm divided into the rows it reduced), which they fuse into
the reduction's kernel, where an expand (a view) ends the group and costs a kernel and a pass over the tensor.
"""
from __future__ import annotations

from torchkiln.builder.settings import BuildSettings
from torchkiln.ir import layers as L
from torchkiln.ir.network import Network
from torchkiln.ir.tensor import Tensor

_BROADCASTING = (L.ElementWiseLayer, L.SelectLayer)


def _spanned(reader: L.Layer, expanded: Tensor, source: Tensor) -> bool:
    """Whether `reader`'s other operands have every dim the expand of `source` to `expanded` makes (a dim where the
    two differ, or one `source` lacks), at that size, aligned from the right as broadcasting aligns them."""
    if not isinstance(reader, _BROADCASTING) or sum(t is expanded for t in reader.inputs) != 1:
        return False
    others = [t for t in reader.inputs if t is not expanded]
    out, rank = tuple(expanded.shape), expanded.rank
    src = (None,) * (rank - source.rank) + tuple(source.shape)
    for d in range(rank):
        if src[d] == out[d]:
            continue
        if not any(t.rank >= rank - d and t.shape[t.rank - rank + d] == out[d] for t in others):
            return False
    return True


def broadcasts_for_expands(network: Network, settings: BuildSettings) -> bool:
    changed = False
    readers = network.consumers()
    for layer in [x for x in network.layers if isinstance(x, L.ExpandLayer)]:
        expanded, source = layer.outputs[0], layer.inputs[0]
        for reader in readers.get(id(expanded), []):
            if _spanned(reader, expanded, source):
                reader.inputs = [source if t is expanded else t for t in reader.inputs]
                changed = True
    return changed
