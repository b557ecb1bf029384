"""Shape-only layers and predicates: values a network's input shapes alone fix, never an input's data.

A layer is *shape-only* when what it computes depends on the input shapes and constants only: a `ShapeLayer`
(every tensor's shape is an expression of the input symbols), and every layer all of whose inputs are
shape-only: constants, `fill` and `dim_value` (no inputs; their symbolic parameters are evaluated when the
symbols are bound), and what is computed from those (the arange, compare and cast of a mask made from
`x.size(1)`; the comparison of `x.size(1) > 64`). No layer kind of the IR is random or keeps state, so a
shape-only layer's value is one function of the input shapes. A data-dependent size (`nonzero`'s count) is not
a shape: a shape layer of a tensor sized by one, or a layer whose parameters use one, is not shape-only.
"""
from __future__ import annotations

from torchkiln.ir import layers as L
from torchkiln.ir.network import Network
from torchkiln.ir.symbolic import symbols_of


def shape_only_layers(network: Network) -> set[int]:
    """Indices (into `network.layers`) of the shape-only layers (see the module docstring)."""
    data = set(network.data_symbols())
    known: set[int] = set()  # ids of tensors whose values the input shapes fix
    found: set[int] = set()
    for j, layer in enumerate(network.layers):
        if symbols_of(list(layer.params().values())) & data:
            continue
        if isinstance(layer, L.ShapeLayer):
            fixed = not symbols_of(list(layer.inputs[0].shape)) & data
        else:
            fixed = all(id(t) in known for t in layer.inputs)
        if fixed:
            found.add(j)
            known.update(id(t) for t in layer.outputs)
    return found


def shape_only_tensors(network: Network) -> set[int]:
    """Ids of the tensors the shape-only layers make."""
    return {id(t) for j in shape_only_layers(network) for t in network.layers[j].outputs}


def shape_only_predicate(network: Network, layer: L.Layer) -> bool:
    """Whether `layer`, a conditional layer of `network`, has a predicate the input shapes alone decide.

    Its predicate's producers trace back to shape layers, constants and dynamic-dim values only (`if x.size(1) >
    64:` on a dynamic dim), never to tensor data: so which branch runs is known once the input shapes are
    bound, before any layer runs (the CUDA runner then captures the taken branch in the graph of that shape).
    False for any other layer, and for a predicate computed from data (`if x.sum() > 0:`), even in part.
    """
    return isinstance(layer, L.ConditionalLayer) and id(layer.inputs[0]) in shape_only_tensors(network)


def shape_only_trips(network: Network, layer: L.Layer) -> bool:
    """Whether `layer`, a loop layer of `network`, runs a number of iterations the input shapes alone decide: its
    trip count and first condition are shape-only (`for i in range(x.size(0))`, or a constant count) and its
    body's condition is a constant (a for loop), so neither depends on what an iteration computes."""
    return isinstance(layer, L.LoopLayer) and _fixed_trips(layer, shape_only_tensors(network))


def decided_by_shapes(network: Network) -> set[int]:
    """Indices (into `network.layers`) of the control-flow layers whose course the input shapes decide: conditionals
    with a shape-only predicate and loops with shape-only trips (`shape_only_predicate`, `shape_only_trips`)."""
    made = shape_only_tensors(network)
    return {j for j, layer in enumerate(network.layers)
            if isinstance(layer, L.ConditionalLayer) and id(layer.inputs[0]) in made
            or isinstance(layer, L.LoopLayer) and _fixed_trips(layer, made)}


def _fixed_trips(layer: L.LoopLayer, made: set[int]) -> bool:
    again = layer.body.outputs[0].producer
    return id(layer.inputs[0]) in made and id(layer.inputs[1]) in made and isinstance(again, L.ConstantLayer)
