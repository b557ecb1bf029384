"""GELU written out as pointwise layers (a model's own formula: 0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 *
x ** 3))), or its erf form) becomes one GELU activation layer, so that backends see the activation: the CUDA
backend runs a tanh GELU in a matrix multiply's library epilogue (planner rule 5b).

Recognized by value, not by pattern: a region of pointwise layers that computes a value from one tensor and
single-number constants alone is a function of one variable, and it is evaluated in float64 on PROBES points. Where
it agrees with GELU (tanh or erf form) within TOLERANCE everywhere, it is replaced. The formulas models write differ
in how they order the terms and in their constants' digits (0.7978845608 or 0.79788456); those differences are far
below float32's rounding. A region whose intermediate values are read outside it, or a tensor of another shape or
dtype, stays as it is."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from torchkiln.builder.settings import BuildSettings
from torchkiln.ir import layers as L
from torchkiln.ir.network import Network
from torchkiln.ir.reference import MEANINGS
from torchkiln.ir.tensor import Tensor

REGION = (L.ElementWiseLayer, L.UnaryLayer, L.ActivationLayer, L.ScaleLayer)
MAX_LAYERS = 16  # the largest region tried
MIN_LAYERS = 4  # fewer layers than any GELU formula needs
PROBES = torch.cat([torch.linspace(-12.0, 12.0, 4801, dtype=torch.float64),
                    torch.linspace(-60.0, 60.0, 241, dtype=torch.float64)])
TOLERANCE = 1e-7  # |region - gelu| <= TOLERANCE * max(1, |gelu|): below float32's rounding of every value
FORMS = {L.ActivationType.GELU_TANH: F.gelu(PROBES, approximate="tanh"), L.ActivationType.GELU_ERF: F.gelu(PROBES)}


def _single(t: Tensor) -> bool:
    """A one-value constant (a formula's coefficient)."""
    value = L.constant_value(t)
    return value is not None and value.numel() == 1 and value.dtype.is_floating_point


def _closure(sink: L.Layer) -> list[L.Layer]:
    """Pointwise layers making `sink`'s inputs, transitively, of its output's shape and dtype, in network order
    (at most MAX_LAYERS)."""
    out = sink.outputs[0]
    found, todo = {id(sink): sink}, [sink]
    while todo and len(found) <= MAX_LAYERS:
        for t in todo.pop().inputs:
            p = t.producer
            if isinstance(p, REGION) and id(p) not in found and t.shape == out.shape and t.dtype == out.dtype:
                found[id(p)] = p
                todo.append(p)
    return list(found.values())


def _region_from(x: Tensor, layers: list[L.Layer], sink: L.Layer) -> list[L.Layer] | None:
    """The layers of `layers` on the way from `x` to `sink`, if everything else they read is a one-value constant."""
    made = {id(x)}
    region = []
    for layer in layers:
        if any(id(t) in made for t in layer.inputs):
            if not all(id(t) in made or _single(t) for t in layer.inputs):
                return None
            region.append(layer)
            made.add(id(layer.outputs[0]))
    return region if region and region[-1] is sink else None


def _evaluate(region: list[L.Layer], x: Tensor) -> torch.Tensor | None:
    """The region's value on PROBES (float64), through the layers' reference meanings; None where one fails."""
    values = {id(x): PROBES}
    try:
        for layer in region:
            xs = [values[id(t)] if id(t) in values else L.constant_value(t).double().reshape(()) for t in layer.inputs]
            weights = {k: w.double() for k, w in layer.weights.items()}
            values[id(layer.outputs[0])] = MEANINGS[type(layer)](layer, xs, weights, torch.device("cpu")).double()
    except Exception:  # noqa: BLE001 - a layer its meaning refuses in float64 is no formula this pass knows
        return None
    return values[id(region[-1].outputs[0])]


def _form(value: torch.Tensor) -> L.ActivationType | None:
    """The GELU form whose values on PROBES (`FORMS`) the region's `value` gives, or None."""
    for kind, expected in FORMS.items():
        if value.shape == expected.shape and bool(
                ((value - expected).abs() <= TOLERANCE * expected.abs().clamp_min(1.0)).all()):
            return kind
    return None


def gelu_from_pointwise(network: Network, settings: BuildSettings) -> bool:
    changed = False
    removed: set[int] = set()
    order, readers = {}, {}
    for sink in reversed(list(network.layers)):
        if not isinstance(sink, REGION) or id(sink) in removed or not sink.outputs[0].dtype.is_floating_point:
            continue
        if not order:  # (made again after each replacement)
            order = {id(layer): k for k, layer in enumerate(network.layers)}
            readers = network.consumers()
        layers = sorted(_closure(sink), key=lambda layer: order[id(layer)])
        if not MIN_LAYERS <= len(layers) <= MAX_LAYERS:
            continue
        out = sink.outputs[0]
        for x in dict.fromkeys(t for layer in layers for t in layer.inputs if not _single(t)):
            region = _region_from(x, layers, sink)
            if region is None or len(region) < MIN_LAYERS or x.shape != out.shape or x.dtype != out.dtype:
                continue
            kept = {id(layer) for layer in region}
            if any(layer.outputs[0] in network.outputs or
                   any(id(r) not in kept for r in readers.get(id(layer.outputs[0]), [])) for layer in region[:-1]):
                continue
            value = _evaluate(region, x)
            kind = None if value is None else _form(value)
            if kind is None:
                continue
            gelu = network.add_activation(x, kind)
            network.move_before(gelu, region[0])
            network.replace_all_uses(out, gelu.outputs[0])
            network.remove_layers(kept)
            removed |= kept
            order = {}
            changed = True
            break
    return changed
