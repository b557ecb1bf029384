"""The CUDA planner's fusion rules, stated over layer classes rather than patterns.

Every layer has a class (`classify`): pointwise (what the pointwise generator computes: elementwise, unary,
activation, cast, scale, parametric ReLU, of float, bool or integer values), reduction (a reduce, softmax or norm
over any of its axes, or a cumulative sum or product along one, that the reduction generator computes:
codegen/reduction.py lowers each into row reductions, scans and pointwise work; a group norm's rows are its (sample,
group) pairs), view
(shuffle, slice, expand, concatenation, padding, gather), library (convolution, matrix multiply, attention) or
opaque (the rest, run on ATen).

A *row group* grows from each reduction, in layer order: it takes, to a fixpoint,
- the pointwise layers making its members' inputs (prologue) and the pointwise layers reading its members'
  outputs (epilogue), where their output is the reduction's whole iteration space or one value per row of it, or
  a tensor broadcast over it that only the group reads (a mask's `~keep`: computed where the group reads it);
- other reductions over the same space and axes (a softmax after the mask add, the second statistic of a norm
  written out in layers, the next norm of a residual stream), and those that read what its members read (sibling
  reductions of one input: its mean and its sum of squares computed apart, one pass over it).
A layer joins only where the group stays legal: it is in no other group; the group runs at its first layer, so
everything it reads from outside is made before that layer (no cycle, nothing reordered); and the kernel reads at
most `MAX_OPERANDS` tensors. Each join saves at least one write and one read of the joined layer's output (an
output read outside the group is still written once), so the rule takes every legal join; the reasons for the
refused ones are logged at debug level, naming both layers.
"""
from __future__ import annotations

import enum
import logging
from collections.abc import Collection

from torchkiln.ir import layers as L
from torchkiln.ir.network import Network
from torchkiln.runtime.backends.cuda.codegen.pointwise import fusable
from torchkiln.runtime.backends.cuda.codegen.reduction import groups_of, reduced_axes, reduction_fusable

logger = logging.getLogger(__name__)

MAX_OPERANDS = 16  # tensors one generated kernel reads (inputs and weights)


class OpClass(enum.Enum):
    POINTWISE = "pointwise"
    REDUCTION = "reduction"
    VIEW = "view"
    LIBRARY = "library"
    OPAQUE = "opaque"


_VIEWS = (L.ShuffleLayer, L.SliceLayer, L.ExpandLayer, L.ConcatenationLayer, L.PaddingLayer, L.GatherLayer)
_LIBRARY = (L.ConvolutionLayer, L.MatrixMultiplyLayer, L.AttentionLayer)


def classify(layer: L.Layer) -> OpClass:
    """The layer's class for fusion (see the module docstring)."""
    if fusable(layer) is None and not isinstance(layer, L.ConstantLayer):
        return OpClass.POINTWISE
    if reduction_fusable(layer) is None:
        return OpClass.REDUCTION
    if isinstance(layer, _VIEWS):
        return OpClass.VIEW
    if isinstance(layer, _LIBRARY):
        return OpClass.LIBRARY
    return OpClass.OPAQUE


class _Space:
    """A row group's iteration space: the shape of its reductions' inputs and the axes they reduce."""

    def __init__(self, seed: L.Layer) -> None:
        self.shape = tuple(seed.inputs[0].shape)
        self.axes = reduced_axes(seed)
        self.groups = groups_of(seed)  # a group norm's rows are (N, group): its dim 1 is split

    def holds(self, layer: L.Layer) -> str | None:
        """None if `layer`'s values lie in this space (the whole of it, or one per row), else why not."""
        cls = classify(layer)
        if cls == OpClass.REDUCTION:
            if tuple(layer.inputs[0].shape) != self.shape or reduced_axes(layer) != self.axes \
                    or groups_of(layer) != self.groups:
                return f"it reduces another space ({list(layer.inputs[0].shape)}, axes {list(reduced_axes(layer))}" + \
                    (f", {groups_of(layer)} groups)" if groups_of(layer) else ")")
            return None
        if cls != OpClass.POINTWISE:
            return f"it is of the {cls.value} class"
        out = tuple(layer.outputs[0].shape)
        if self.fits(out) is not None:
            return None
        return f"its output {list(out)} is neither the space {list(self.shape)}, one value per row of it, nor a " \
               f"tensor broadcast over it"

    def fits(self, shape: tuple) -> str | None:
        """How a value of `shape` lies in the space: "whole", "row" (one value per row, kept dims), "broadcast" (a
        [N, 1, 1, S] mask of [N, H, Q, S] scores: computed for every element where the group reads it) or None."""
        rank = len(self.shape)
        if shape == self.shape:
            return "whole"
        if len(shape) == rank and self.groups is None and all(
                d == (1 if a in self.axes else s) for a, (d, s) in enumerate(zip(shape, self.shape))):
            return "row"
        padded = (1,) * (rank - len(shape)) + shape
        if len(shape) <= rank and all(d == 1 or d == s for d, s in zip(padded, self.shape)):
            return "broadcast"
        return None


class _Graph:
    """Who reads each tensor, and where each layer stands."""

    def __init__(self, network: Network) -> None:
        self.layers = network.layers
        self.index = {id(layer): j for j, layer in enumerate(network.layers)}
        self.readers: dict[int, list[int]] = {}
        self.returned = {id(t) for t in network.outputs}
        for j, layer in enumerate(network.layers):
            for t in layer.inputs:
                self.readers.setdefault(id(t), []).append(j)

    def made_at(self, t) -> int:
        """The index of the layer making `t`; -1 for a network input or a constant (the plan makes its constants
        first)."""
        return -1 if t.producer is None or isinstance(t.producer, L.ConstantLayer) else self.index[id(t.producer)]


def _why_not(j: int, members: set[int], space: _Space, graph: _Graph, taken: Collection[int]) -> str | None:
    """None if layer `j` may join the group of `members`, else why not."""
    layer = graph.layers[j]
    if j in taken:
        return "it is in another group"
    reason = space.holds(layer)
    if reason is not None:
        return reason
    dropped = [t.name for t in layer.inputs if t.producer is not None and graph.index[id(t.producer)] in members
               and t.rank < len(space.shape) and classify(t.producer) == OpClass.REDUCTION]
    if dropped:
        return f"it reads {dropped}, reduced without their kept dims"
    joined = members | {j}
    out = layer.outputs[0]
    if classify(layer) == OpClass.POINTWISE and space.fits(tuple(out.shape)) == "broadcast" and (
            id(out) in graph.returned or any(r not in joined for r in graph.readers.get(id(out), []))):
        return "its output is broadcast over the group's space, so the group computes it but cannot write it"
    first = min(joined)
    outside = {id(t): t for m in joined for t in graph.layers[m].inputs
               if t.producer is None or graph.index[id(t.producer)] not in joined}
    late = [t.name for t in outside.values() if graph.made_at(t) >= first]
    if late:
        return f"the group would read {late[:3]} before they are made (it runs at its first layer)"
    weights = sum(len(graph.layers[m].weights) for m in joined)
    if len(outside) + weights > MAX_OPERANDS:
        return f"the kernel would read {len(outside) + weights} tensors (at most {MAX_OPERANDS})"
    return None


def row_groups(network: Network, taken: Collection[int] = ()) -> list[list[int]]:
    """The row groups of `network` (module docstring), each its layer indices in order; layers in `taken` are left
    out."""
    graph = _Graph(network)
    used = set(taken)
    groups = []
    for j, layer in enumerate(network.layers):
        if j in used or classify(layer) != OpClass.REDUCTION:
            continue
        space, members = _Space(layer), {j}
        grew = True
        while grew:
            grew = False
            for m in sorted(members):
                near = [graph.index[id(t.producer)] for t in graph.layers[m].inputs if t.producer is not None]
                near += [r for t in graph.layers[m].outputs for r in graph.readers.get(id(t), [])]
                near += [r for t in graph.layers[m].inputs if not isinstance(t.producer, L.ConstantLayer)
                         for r in graph.readers.get(id(t), []) if classify(graph.layers[r]) == OpClass.REDUCTION]
                for k in near:
                    if k in members:
                        continue
                    reason = _why_not(k, members, space, graph, used)
                    if reason is None:
                        members.add(k)
                        grew = True
                    else:
                        logger.debug("%s %r stays out of the row group of %r: %s", graph.layers[k].KIND,
                                     graph.layers[k].name, layer.name, reason)
        used |= members
        groups.append(sorted(members))
    return groups


def row_join_refusal(network: Network, j: int, members: Collection[int]) -> str | None:
    """Why layer `j` stays out of the row group of `members` (its reductions and pointwise layers), by the rule
    `row_groups` applies (None: it may join now; another group took it first)."""
    seed = min(m for m in members if classify(network.layers[m]) == OpClass.REDUCTION)
    return _why_not(j, set(members), _Space(network.layers[seed]), _Graph(network), ())
