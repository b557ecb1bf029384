"""Dynamic shapes in shape analysis: which dims of each top-level tensor vary across the Input ranges.

Shape analysis runs at the inputs' min, opt and max shapes. A dim that is the same in all three runs is
an int. Input dims with a range become symbols. Dims of two different inputs at the same position with
the same (min, opt, max) are one symbol (the batch of input_ids and of attention_mask) and must be equal
at run time (the engine checks it); the dims of one input are always distinct symbols.
A varying dim of a value computed inside the graph is the input symbol with the same triple when only
one has it, or else a symbol of its own whose range is what the runs saw (it matters where such a value
enters an engine from PyTorch; inside an engine, symbolic shape inference gives its exact expression).
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import logging

import torch

from torchkiln.ir.symbolic import DimSymbol
from torchkiln.analysis.shape_analysis import analyze_shapes, example_args
from torchkiln.settings import Input
from torchkiln.torchscript import Graph, TensorMeta

logger = logging.getLogger("torchkiln.analysis")


class SymbolTable:
    """The symbols of one compilation, each with the three values shape analysis saw (min, opt, max)."""

    def __init__(self) -> None:
        self.samples: dict[DimSymbol, tuple[int, int, int]] = {}
        self._inputs: dict[tuple[int, tuple[int, int, int]], DimSymbol] = {}  # (dim index, triple) -> symbol

    def new(self, triple: tuple[int, int, int]) -> DimSymbol:
        s = DimSymbol(f"s{len(self.samples)}", min(triple), max(triple), samples=triple)
        self.samples[s] = triple
        return s

    def input_symbol(self, index: int, triple: tuple[int, int, int]) -> DimSymbol:
        key = (index, triple)
        if key not in self._inputs:
            self._inputs[key] = self.new(triple)
        return self._inputs[key]

    def lookup(self, index: int, triple: tuple[int, int, int]) -> DimSymbol | None:
        """The input symbol of this dim index and triple, else the one input symbol with this triple."""
        if (index, triple) in self._inputs:
            return self._inputs[(index, triple)]
        found = {s for (_, t), s in self._inputs.items() if t == triple}
        return found.pop() if len(found) == 1 else None


def input_symbols(signature: Sequence[Any], table: SymbolTable) -> None:
    """Create the symbols of every Input dim with a range, in argument order (s0, s1, ...)."""
    def visit(spec: Any) -> None:
        if isinstance(spec, Input):
            for index, triple in enumerate(zip(spec.min_shape, spec.opt_shape, spec.max_shape)):
                if triple[0] != triple[2]:
                    table.input_symbol(index, triple)
        elif isinstance(spec, dict):
            for s in spec.values():
                visit(s)
        else:
            for s in spec:
                visit(s)

    for spec in signature:
        visit(spec)


class _RankChanges(Exception):
    """A value whose rank differs between the runs (`x.squeeze(0)` of a batch in [1, 4])."""


def _merge(metas: Sequence[TensorMeta], table: SymbolTable, where: str) -> TensorMeta:
    lo, opt, hi = metas
    if not lo.rank == opt.rank == hi.rank:
        raise _RankChanges(f"{where}: {lo.shape}, {opt.shape}, {hi.shape}")
    dims = []
    for index, triple in enumerate(zip(lo.shape, opt.shape, hi.shape)):
        if triple[0] == triple[1] == triple[2]:
            dims.append(triple[1])
        else:
            dims.append(table.lookup(index, triple) or table.new(triple))
    return TensorMeta(tuple(dims), opt.dtype, opt.device)


def symbolic_metas(runs: Sequence[Mapping[int, Any]], table: SymbolTable) -> dict[int, Any]:
    """Metas of the opt run with each varying dim made symbolic, from the min, opt and max runs."""
    lo, opt, hi = runs
    merged: dict[int, Any] = {}
    for key, meta in opt.items():
        if key not in lo or key not in hi:
            continue  # not seen in every run: a run-time value only PyTorch can compute
        try:
            if isinstance(meta, TensorMeta):
                merged[key] = _merge((lo[key], meta, hi[key]), table, f"value {key}")
            elif len(lo[key]) == len(meta) == len(hi[key]):
                merged[key] = [_merge(ms, table, f"value {key}[{i}]") for i, ms in enumerate(zip(lo[key], meta, hi[key]))]
        except _RankChanges as e:  # left without metadata, so its node and its readers stay in PyTorch
            logger.debug("rank changes across the input ranges, kept in PyTorch: %s", e)
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
