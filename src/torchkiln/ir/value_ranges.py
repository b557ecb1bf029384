"""Integer value ranges: for an integer or boolean tensor, bounds that every value it can hold lies within, proved
from the layers that make it by interval arithmetic (constants, casts, sums, differences, products, minima and
maxima, cumulative sums, gathers and moves of such values; a boolean is 0 or 1), or none where no rule applies (a
network input, a division, a cast from a float).

A generated gather reads its data at indices proved in range without checking them (codegen/indexed.py): a
position id computed from a mask and a cumulative sum is always a valid row of its position table, while a token
id that is a network input is not known to be, and its gather stays with ATen, which checks it.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from torchkiln.ir import layers as L
from torchkiln.ir.tensor import Tensor

Range = tuple[int, int]  # the smallest and largest value, both included
_Rule = Callable[[L.Layer, Sequence["Range | None"]], "Range | None"]
_RULES: dict[type, _Rule] = {}

_E = L.ElementWiseOperation


def _rule(*kinds: type) -> Callable[[_Rule], _Rule]:
    def register(fn: _Rule) -> _Rule:
        _RULES.update((kind, fn) for kind in kinds)
        return fn
    return register


def _integral(dtype: torch.dtype) -> bool:
    return dtype == torch.bool or (not dtype.is_floating_point and not dtype.is_complex)


def _fits(found: Range, dtype: torch.dtype) -> bool:
    """Whether `dtype` holds every value of `found` (else the values wrapped, and the range proves nothing)."""
    if dtype == torch.bool:
        return 0 <= found[0] and found[1] <= 1
    info = torch.iinfo(dtype)
    return info.min <= found[0] and found[1] <= info.max


MAX_DEPTH = 64  # layers a proof looks back through (beyond: no range)


def proved_range(t: Tensor, memo: dict[int, Range | None] | None = None, depth: int = 0) -> Range | None:
    """The range every value of integer or boolean tensor `t` lies in, proved from the layers that make it (through
    its producers, up to MAX_DEPTH layers back), or None."""
    if t.dtype == torch.bool:
        return 0, 1
    if not _integral(t.dtype):
        return None
    memo = {} if memo is None else memo
    if id(t) in memo:
        return memo[id(t)]
    layer, found = t.producer, None
    rule = _RULES.get(type(layer)) if layer is not None and len(layer.outputs) == 1 else None
    if rule is not None and depth < MAX_DEPTH:
        found = rule(layer, [proved_range(x, memo, depth + 1) for x in layer.inputs])
        if found is not None and not (found[0] <= found[1] and _fits(found, t.dtype)):
            found = None  # the values may wrap
    memo[id(t)] = found
    return found


@_rule(L.ConstantLayer)
def _constant(layer: L.ConstantLayer, inputs: Sequence[Range | None]) -> Range | None:
    value = layer.weights["value"]
    if value.numel() == 0 or not _integral(value.dtype):
        return None
    return int(value.min()), int(value.max())


@_rule(L.CastLayer, L.IdentityLayer, L.ShuffleLayer, L.SliceLayer, L.ExpandLayer)
def _same(layer: L.Layer, inputs: Sequence[Range | None]) -> Range | None:
    """Values moved or converted between integer types keep their range (a cast that would wrap is refused by the
    fit check)."""
    return inputs[0] if _integral(layer.inputs[0].dtype) else None


@_rule(L.ConcatenationLayer)
def _union(layer: L.Layer, inputs: Sequence[Range | None]) -> Range | None:
    if any(r is None for r in inputs) or not inputs:
        return None
    return min(r[0] for r in inputs), max(r[1] for r in inputs)


@_rule(L.GatherLayer)
def _gathered(layer: L.GatherLayer, inputs: Sequence[Range | None]) -> Range | None:
    """A gather's values are some of its data's (an index out of range raises instead)."""
    return inputs[0]


@_rule(L.ElementWiseLayer)
def _elementwise(layer: L.ElementWiseLayer, inputs: Sequence[Range | None]) -> Range | None:
    a, b = inputs  # (a comparison's output is boolean: [0, 1] without a rule)
    if a is None or b is None:
        return None
    if layer.op == _E.SUM:
        return a[0] + b[0], a[1] + b[1]
    if layer.op == _E.SUB:
        return a[0] - b[1], a[1] - b[0]
    if layer.op == _E.PROD:
        products = [x * y for x in a for y in b]
        return min(products), max(products)
    if layer.op == _E.MAX:
        return max(a[0], b[0]), max(a[1], b[1])
    if layer.op == _E.MIN:
        return min(a[0], b[0]), min(a[1], b[1])
    return None


@_rule(L.CumulativeLayer)
def _cumulative(layer: L.CumulativeLayer, inputs: Sequence[Range | None]) -> Range | None:
    """A running sum of up to n values of [lo, hi]: between min(lo, n * lo) and max(hi, n * hi)."""
    (r,) = inputs
    n = layer.inputs[0].shape[layer.axis] if layer.inputs[0].rank else 1
    if r is None or layer.op != L.CumulativeOperation.SUM or not isinstance(n, int):
        return None
    return min(r[0], n * r[0]), max(r[1], n * r[1])
