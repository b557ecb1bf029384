"""Shape-only layers: values fixed by the input shapes alone, computed once per input-shape signature.

A layer is *shape-only* when what it computes depends on the engine's input shapes and constants, never on
an input's values (`ir/shape_only.py`). A static engine's builder folds such layers into constants; a dynamic
engine can fold them only once its symbols are bound.

A runner folds a *step* (`Plan.steps`) when every layer in it is shape-only (and not all are constants,
which cost nothing already): its outputs are computed here with the reference meanings, once per input-shape
signature, and the step becomes those tensors. A step mixing shape-only and value layers (a generated
pointwise group whose mask joins the add that reads it) keeps running whole: it is one kernel launch either
way, and splitting it would change the generated kernel. The shape-only layers before it are still folded,
so it reads precomputed tensors. Folding keeps at most `MAX_FOLDED_BYTES` per signature (steps in order):
a large shape-only tensor (`zeros_like` of an activation) is computed per call as before.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence

import torch

from torchkiln.ir import layers as L
from torchkiln.ir.network import Network
from torchkiln.ir.reference import run_layer
from torchkiln.ir.shape_only import shape_only_layers
from torchkiln.ir.symbolic import DimSymbol, substitute
from torchkiln.ir.tensor import Tensor
from torchkiln.runtime.plan import Step, StepIO

MAX_FOLDED_BYTES = 8 << 20  # per input-shape signature: a runner keeps several signatures bound

Specialize = Callable[[L.Layer], L.Layer]  # a layer with its symbolic parameters evaluated at the bindings


class ShapeFolding:
    """A network's shape-only layers, and the steps of a plan that consist of them."""

    def __init__(self, network: Network, steps: Sequence[Step]) -> None:
        self.network = network
        self.layers = shape_only_layers(network)
        self.index = {id(layer): j for j, layer in enumerate(network.layers)}
        self.steps = [k for k, step in enumerate(steps)
                      if all(j in self.layers for j in step.layers)
                      and not all(isinstance(network.layers[j], L.ConstantLayer) for j in step.layers)]

    def fold(self, io: Sequence[StepIO], tensor_at: Mapping[int, int], bindings: Mapping[DimSymbol, int],
             specialize: Specialize, weights: Sequence[dict[str, torch.Tensor]], device: torch.device
             ) -> dict[int, list[torch.Tensor]]:
        """For each foldable step (within the byte budget at these bindings): its output values, in
        `io[k].outputs` order. `tensor_at` maps a slot to its tensor id; `weights` are the layers' own, on
        `device`."""
        chosen: dict[int, list[Tensor]] = {}
        by_id = {id(t): t for layer in self.network.layers for t in layer.outputs}
        budget = MAX_FOLDED_BYTES
        for k in self.steps:
            outs = [by_id[tensor_at[s]] for s in io[k].outputs]
            size = sum(math.prod(substitute(t.shape, bindings)) * t.dtype.itemsize for t in outs)
            if size <= budget:
                budget -= size
                chosen[k] = outs
        values = self.values([t for outs in chosen.values() for t in outs], bindings, specialize, weights, device)
        return {k: [values[id(t)] for t in outs] for k, outs in chosen.items()}

    def values(self, tensors: Sequence[Tensor], bindings: Mapping[DimSymbol, int], specialize: Specialize,
               weights: Sequence[dict[str, torch.Tensor]], device: torch.device) -> dict[int, torch.Tensor]:
        """The values of shape-only `tensors` (by tensor id) at these bindings, by the reference meanings."""
        needed: set[int] = set()
        todo = [self.index[id(t.producer)] for t in tensors]
        while todo:
            j = todo.pop()
            if j in needed:
                continue
            if j not in self.layers:
                raise ValueError(f"layer {self.network.layers[j].name!r} is not shape-only")
            needed.add(j)
            layer = self.network.layers[j]
            if not isinstance(layer, L.ShapeLayer):  # a shape layer reads only its input's shape
                todo.extend(self.index[id(t.producer)] for t in layer.inputs)
        values: dict[int, torch.Tensor] = {}
        for j in sorted(needed):
            layer = specialize(self.network.layers[j])
            if isinstance(layer, L.ShapeLayer):
                x = layer.inputs[0]
                xs = [torch.empty(substitute(x.shape, bindings), dtype=x.dtype, device="meta")]
            else:
                xs = [values[id(t)] for t in layer.inputs]
            values.update(zip(map(id, layer.outputs), run_layer(layer, xs, weights[j], device)))
        return {id(t): values[id(t)] for t in tensors}


def precomputed(values: Sequence[torch.Tensor], returned: Sequence[bool]
                ) -> Callable[[list[torch.Tensor]], list[torch.Tensor]]:
    """A step's callable that gives folded values; one the engine returns is copied each call, so what a call
    returns is the caller's (a later call never hands out the same tensor)."""
    values, returned = list(values), list(returned)
    if not any(returned):
        return lambda xs: values
    return lambda xs: [v.clone() if r else v for v, r in zip(values, returned)]
