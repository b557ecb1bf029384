"""Binding an engine's dim symbols at run time: read them off the actual input shapes, check each one's
range and that a symbol used by two inputs has one value, then evaluate every layer's symbolic
parameters to ints. The result is cached per input-shape signature, so a call with shapes seen before
costs one dictionary lookup.

A data-dependent layer (nonzero, unique) defines a symbol of its own, its output size: it is bound from the layer's
first output once the layer has run (TensorRT's output allocator), and the layers whose parameters use it are
specialized then, on each call."""
from __future__ import annotations

import dataclasses
import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import torch

from torchkiln.errors import EngineFormatError, EngineInputError
from torchkiln.ir.network import Network
from torchkiln.ir.symbolic import DimSymbol, has_symbols, substitute, symbols_of
from torchkiln.ir.symbolic_shapes import symbolic_params

MAX_CACHED_SIGNATURES = 256


class SymbolBinder:
    """Where each symbol of a network appears among its inputs, and the steps specialized per signature."""

    def __init__(self, network: Network) -> None:
        self.names = [t.name for t in network.inputs]
        self.slots: list[tuple[int, int, DimSymbol]] = []
        for i, t in enumerate(network.inputs):
            for j, d in enumerate(t.shape):
                if isinstance(d, DimSymbol):
                    self.slots.append((i, j, d))
                elif has_symbols(d):
                    raise EngineFormatError(f"network input {t.name!r} dim {j} is {d}: an input dim must be an "
                                            f"int or a single symbol")
        data = network.data_symbols()
        self.defines = {id(layer): s for s, layer in data.items()}  # bound when the layer has run
        self.symbolic_layers: dict[int, list[str]] = {}
        self.late: set[int] = set()  # layers whose parameters use a data-dependent symbol
        for layer in network.layers:
            params = symbolic_params(layer) if id(layer) not in self.defines else {}
            if params:
                self.symbolic_layers[id(layer)] = list(params)
                if symbols_of(list(params.values())) & data.keys():
                    self.late.add(id(layer))
        self._cache: OrderedDict[tuple, list] = OrderedDict()
        self._lock = threading.Lock()

    @staticmethod
    def for_network(network: Network) -> SymbolBinder | None:
        """A binder for a network with dynamic dims; None for one of static shapes."""
        return SymbolBinder(network) if network.symbols() else None

    def bind(self, shapes: Sequence[tuple[int, ...]]) -> dict[DimSymbol, int]:
        """Each symbol's value for these input shapes; an EngineInputError names any input that does not fit."""
        bindings: dict[DimSymbol, int] = {}
        first: dict[DimSymbol, tuple[int, int]] = {}
        for i, j, s in self.slots:
            value = shapes[i][j]
            if not s.lo <= value <= s.hi:
                raise EngineInputError(f"engine input {i} ({self.names[i]!r}) dim {j} is {value}, outside the "
                                       f"range [{s.lo}, {s.hi}] of {s.name} the engine was built for")
            if s in bindings and bindings[s] != value:
                k, m = first[s]
                raise EngineInputError(
                    f"engine input {i} ({self.names[i]!r}) dim {j} is {value} but input {k} "
                    f"({self.names[k]!r}) dim {m} is {bindings[s]}; both are {s.name} and must be equal")
            bindings[s] = value
            first.setdefault(s, (i, j))
        return bindings

    def specialize(self, layer: Any, bindings: dict[DimSymbol, int]) -> Any:
        """`layer`, or a copy whose symbolic parameters are evaluated at `bindings`."""
        fields = self.symbolic_layers.get(id(layer))
        if not fields:
            return layer
        return dataclasses.replace(layer, **{f: substitute(getattr(layer, f), bindings) for f in fields})

    def steps_for(self, inputs: Sequence[torch.Tensor], steps: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
        """`steps` (fn, layer, ...) with each symbolic layer replaced by a copy whose parameters are ints."""
        key = tuple(tuple(x.shape) for x in inputs)
        found = self._cache.get(key)
        if found is not None:
            return found
        bindings = self.bind(key)
        specialized = []
        for step in steps:
            layer = step[1] if id(step[1]) in self.late else self.specialize(step[1], bindings)
            if layer is not step[1]:
                step = (step[0], layer) + tuple(step[2:])
            specialized.append(step)
        with self._lock:
            self._cache[key] = specialized
            while len(self._cache) > MAX_CACHED_SIGNATURES:
                self._cache.popitem(last=False)
        return specialized

    def bind_defined(self, layer: Any, outputs: Sequence[torch.Tensor], bindings: dict[DimSymbol, int]) -> None:
        """After `layer` has run: the data-dependent symbol it defines, bound to its first output's size."""
        s = self.defines.get(id(layer))
        if s is not None:
            bindings[s] = outputs[0].shape[0]

    def late_layer(self, layer: Any, bindings: dict[DimSymbol, int]) -> Any:
        """`layer`, or, where its parameters use a data-dependent symbol, a copy specialized at `bindings`."""
        return self.specialize(layer, bindings) if id(layer) in self.late else layer
