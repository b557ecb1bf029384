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
from torchkiln.ir.symbolic import SymbolicError, broadcast_shapes
from torchkiln.ir.tensor import Tensor

_BROADCASTING = (L.ElementWiseLayer, L.SelectLayer)


def _spanned(reader: L.Layer, expanded: Tensor, source: Tensor) -> bool:
    """Whether `reader` (reading `expanded` once) broadcasts its operands to the same shape with `source` in its
    place: its other operands then have every dim the expand makes."""
    if not isinstance(reader, _BROADCASTING) or sum(t is expanded for t in reader.inputs) != 1:
        return False
    others = [t.shape for t in reader.inputs if t is not expanded]
    try:
        return broadcast_shapes(*others, source.shape) == broadcast_shapes(*others, expanded.shape)
    except SymbolicError:  # symbolic dims the ranges do not settle: left as it is
        return False


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
