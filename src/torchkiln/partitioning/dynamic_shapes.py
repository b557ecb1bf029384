"""Dynamic shapes in shape analysis: which dims of each top-level tensor vary across the Input ranges.

Shape analysis runs at the inputs' min, opt and max shapes. A dim that is the same in all three runs is
an int. Input dims with a range become symbols: one symbol per distinct (min, opt, max) triple, so dims
declared with the same range are the same symbol and must be equal at run time (the engine checks it).
A varying dim of a value computed inside the graph is the input symbol with the same triple, or else a
symbol of its own whose range is what the runs saw (it matters where such a value enters an engine
from PyTorch; inside an engine, symbolic shape inference gives its exact expression).
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from torchkiln.network.symbolic import DimSymbol
from torchkiln.partitioning.shape_analysis import analyze_shapes
from torchkiln.partitioning.signature import example_args
from torchkiln.settings import Input
from torchkiln.torchscript import Graph, TensorMeta

RUNS = ("min", "opt", "max")


class SymbolTable:
    """The symbols of one compilation, each with the three values shape analysis saw (min, opt, max)."""

    def __init__(self) -> None:
        self.samples: dict[DimSymbol, tuple[int, int, int]] = {}
        self._by_triple: dict[tuple[int, int, int], DimSymbol] = {}

    def symbol(self, triple: tuple[int, int, int], input_dim: bool) -> DimSymbol:
        found = self._by_triple.get(triple)
        if found is not None:
            return found
        s = DimSymbol(f"s{len(self.samples)}", min(triple), max(triple), samples=triple)
        self.samples[s] = triple
        if input_dim:  # computed dims never name a triple: only input dims are matched
            self._by_triple[triple] = s
        return s

    def lookup(self, triple: tuple[int, int, int]) -> DimSymbol | None:
        return self._by_triple.get(triple)


def input_symbols(signature: Sequence[Any], table: SymbolTable) -> None:
    """Create the symbols of every Input dim with a range, in argument order (s0, s1, ...)."""
    def visit(spec: Any) -> None:
        if isinstance(spec, Input):
            for triple in zip(spec.min_shape, spec.opt_shape, spec.max_shape):
                if triple[0] != triple[2]:
                    table.symbol(triple, input_dim=True)
        elif isinstance(spec, dict):
            for s in spec.values():
                visit(s)
        else:
            for s in spec:
                visit(s)

    for spec in signature:
        visit(spec)


def _merge(metas: Sequence[TensorMeta], table: SymbolTable, where: str) -> TensorMeta:
    lo, opt, hi = metas
    if not lo.rank == opt.rank == hi.rank:
        raise ValueError(f"inputs: the rank of {where} changes between the min, opt and max shapes "
                         f"({lo.shape}, {opt.shape}, {hi.shape}); dynamic shapes need a fixed rank")
    dims = []
    for triple in zip(lo.shape, opt.shape, hi.shape):
        if triple[0] == triple[1] == triple[2]:
            dims.append(triple[1])
        else:
            dims.append(table.lookup(triple) or table.symbol(triple, input_dim=False))
    return TensorMeta(tuple(dims), opt.dtype, opt.device)


def symbolic_metas(runs: Sequence[Mapping[int, Any]], table: SymbolTable) -> dict[int, Any]:
    """Metas of the opt run with each varying dim made symbolic, from the min, opt and max runs."""
    lo, opt, hi = runs
    merged: dict[int, Any] = {}
    for key, meta in opt.items():
        if key not in lo or key not in hi:
            merged[key] = meta
        elif isinstance(meta, TensorMeta):
            merged[key] = _merge((lo[key], meta, hi[key]), table, f"value {key}")
        elif len(lo[key]) == len(meta) == len(hi[key]):
            merged[key] = [_merge(ms, table, f"value {key}[{i}]") for i, ms in enumerate(zip(lo[key], meta, hi[key]))]
        else:
            raise ValueError(f"inputs: a list of tensors changes length between the min, opt and max shapes; "
                             f"dynamic shapes need a fixed length")
    return merged


def analyze_dynamic_shapes(graph: Graph, module: torch.jit.ScriptModule | None, signature: Sequence[Any],
                           device: torch.device, examples: Sequence[Any]) -> dict[int, Any]:
    """Shape analysis at the opt examples, and with dynamic inputs also at min and max: symbolic metas."""
    opt = analyze_shapes(graph, module, examples)
    table = SymbolTable()
    input_symbols(signature, table)
    if not table.samples:
        return opt
    lo = analyze_shapes(graph, module, example_args(signature, device, "min"))
    hi = analyze_shapes(graph, module, example_args(signature, device, "max"))
    return symbolic_metas((lo, opt, hi), table)
